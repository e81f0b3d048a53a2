#!/usr/bin/env bash
# Figure 15, ElasticTrainer only (no baselines): ResNet50 at rho 0.5 on CUB-200, Oxford-IIIT Pet
# and Stanford Dogs, Jetson TX2 protocol.  See run_figure15.sh for the paper's numbers.
# Time on a Jetson TX2: about 6.5 h (the reference's estimate).
# Writes figures/fig15_ego.{png,pdf}, fig15_ego_bars.*, fig15_ego_profile.*; SMOKE=1: figures/smoke/.
exec "$(dirname "$0")/figure.sh" fig15 --ego "$@"
