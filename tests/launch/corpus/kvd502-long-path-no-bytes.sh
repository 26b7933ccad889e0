#!/usr/bin/env bash
python -m infera.kvd --socket /var/run/infera-kvd.sock --max-bytes 16G --long-path /nvme/kvd-long
python -m infera.kvd --socket /var/run/infera-kvd2.sock --max-bytes lots --log-level verbose
python -m infera.kvd --socket /var/run/infera-kvd3.sock --long-backend mooncake --cache-size 4G
