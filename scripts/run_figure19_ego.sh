#!/usr/bin/env bash
# Figure 19, ElasticTrainer only: the four models on CUB-200 at rho 0.4.
# Time: about 3.5 h on a Jetson TX2, 50 h on a Raspberry Pi 4B (the reference's estimates).
# Writes figures/fig19_ego.{png,pdf,md} and fig19_ego_profile_<model>.*; SMOKE=1: figures/smoke/.
exec "$(dirname "$0")/figure.sh" fig19 --ego "$@"
