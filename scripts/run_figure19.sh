#!/usr/bin/env bash
# Figure 19: ResNet50, VGG16, MobileNetV2 and ViT-B/16 on CUB-200, ElasticTrainer at rho 0.4
# against full training, traditional TL, BN+Bias and PruneTrain: best accuracy and training time
# per model.  ViT trains with Adam, as the reference advises; the CNNs with SGDW.
#
# Paper: ElasticTrainer keeps full training's accuracy on every model at a fraction of its time;
# compare against the paper's Fig. 19 (our notes hold no numbers read off it).
# Time: about 20 h on a Jetson TX2, 310 h on a Raspberry Pi 4B (the reference's estimates).
#
# Writes figures/fig19.{png,pdf,md} and fig19_profile_<model>.*; SMOKE=1 runs smallcnn and
# MobileNetV2 fine-tuned from --weights synthetic at 64 px on the synthetic data at rho 0.4 and
# writes the same files under figures/smoke/ (MobileNetV2 pretrains once first, about 1.5 min).
# OFFLINE=1: the backbones --weights synthetic pretrains (MobileNetV2, smallcnn) in the paper's
# regime offline at rho 0.4, under figures/offline/ with fig19.md (each scheme against full
# training, and whether the paper's ordering holds).
exec "$(dirname "$0")/figure.sh" fig19 "$@"
