#!/usr/bin/env bash
# Figure 16: test accuracy and training loss against wall-clock training time, Raspberry Pi 4B.
# The protocol of Figure 15 (ResNet50 on CUB-200, Oxford-IIIT Pet, Stanford Dogs; ElasticTrainer
# at rho 0.5 against full training, traditional TL and BN+Bias) on the Pi's CPU.
#
# Paper: the same ordering as on the Jetson, about 8x longer; compare against the paper's
# Fig. 16 (our notes hold no numbers read off it).
# Time on a Raspberry Pi 4B: about 200 h (the reference states ~52 h for ElasticTrainer alone;
# full training takes about twice as long as ElasticTrainer at rho 0.5 and the two cheaper
# baselines about as long again).
#
# Writes figures/fig16.{png,pdf}, fig16_bars.*, fig16_profile.*; SMOKE=1: figures/smoke/.
exec "$(dirname "$0")/figure.sh" fig16 "$@"
