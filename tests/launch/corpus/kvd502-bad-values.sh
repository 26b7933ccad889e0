#!/usr/bin/env bash
# every value is checked by the flag's own validator, the one `kvd serve` uses
python -m infera.kvd --socket /run/a.sock --busy-poll-us -5 --fsync maybe
python -m infera.kvd --socket /run/b.sock --socket-mode 999 --ephemeral-ttl forever --prefault=yes
python -m infera.kvd --socket /run/c.sock --long-backend mooncake --mooncake-master nohost
INFERA_KVD_MOONCAKE_PROTOCOL=udp python -m infera.kvd --socket /run/d.sock --long-backend mooncake --mooncake-master m:50051
python -m infera.kvd --socket /run/e.sock --mooncake-master m:50051 --allow-uid 'root:0'
python -m infera.kvd --socket /run/f.sock --long-path "$LONG_DIR" --long-bytes "$LONG_BYTES" --metrics-port "$PORT"
