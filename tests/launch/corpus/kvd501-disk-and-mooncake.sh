#!/usr/bin/env bash
python -m infera.kvd --socket /var/run/infera-kvd.sock --max-bytes 16G \
  --long-path /nvme/kvd-long --long-bytes 256G \
  --long-backend mooncake --mooncake-master mooncake:50051
