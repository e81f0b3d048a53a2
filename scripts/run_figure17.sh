#!/usr/bin/env bash
# Figure 17 (and the selection heat map of Figure 21): ResNet50 on CUB-200, ElasticTrainer at
# rho 0.35 / 0.4 / 0.5 / 0.6 / 0.7 against full training, traditional TL, BN+Bias and
# PruneTrain: bars of best test accuracy and of training time.  Honest rho: 0.35 means 35% of the
# full step time (the reference passed 0.367 for "35%" and 0.533 for "50%").
#
# Paper (Jetson TX2, read off the plots): rho 40% 66.5% in 0.85 h; full training 69% in 2.95 h;
# traditional TL 43% in 0.7 h; BN+Bias 57.5% in 1.8 h; PruneTrain 69.5% in 2.8 h.
# Time: about 15 h on a Jetson TX2, 190 h on a Raspberry Pi 4B (the reference's estimates).
#
# Writes figures/fig17.{png,pdf,md} (bars + table), fig17_curves.*, fig17_fig21.* (tensor
# selection over epochs at rho 0.5), fig17_profile.*; SMOKE=1: the same under figures/smoke/,
# with rho 0.4 / 0.5 / 0.6 / 0.7 (the small model's forward pass is about 0.31 of its step).
# OFFLINE=1: the paper's regime offline (EfficientNet-Lite0 from its ImageNet weights on
# synthetic_textures, 96 px, batch 8, SGD, 8 epochs; ResNet50 has no offline weights) at the
# paper's rhos, about 25 min on 2 cores; writes the same under figures/offline/, fig17.md being
# our numbers beside the paper's.
exec "$(dirname "$0")/figure.sh" fig17 "$@"
