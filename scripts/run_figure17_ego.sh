#!/usr/bin/env bash
# Figure 17, ElasticTrainer only: ResNet50 on CUB-200 at rho 0.35 / 0.4 / 0.5 / 0.6 / 0.7.
# Time: about 9 h on a Jetson TX2, 85 h on a Raspberry Pi 4B (the reference's estimates).
# Writes figures/fig17_ego.{png,pdf,md}, fig17_ego_curves.*, fig17_ego_fig21.*, fig17_ego_profile.*.
exec "$(dirname "$0")/figure.sh" fig17 --ego "$@"
