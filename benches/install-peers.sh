#!/usr/bin/env bash
# Installs the benchmark peers and tools from Debian's packages (not needed by the tests).
set -euo pipefail
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light haproxy golang-go wrk nghttp2-client
