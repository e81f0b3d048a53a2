#!/usr/bin/env bash
# Figure 16, ElasticTrainer only: ResNet50 at rho 0.5 on the three datasets, Raspberry Pi 4B.
# Time on a Raspberry Pi 4B: about 52 h (the reference's estimate).
# Writes figures/fig16_ego.{png,pdf}, fig16_ego_bars.*, fig16_ego_profile.*; SMOKE=1: figures/smoke/.
exec "$(dirname "$0")/figure.sh" fig16 --ego "$@"
