#!/bin/sh
# hotloop on several nodes on this machine, for trying the reference deployment:
# PostgreSQL, simulated vLLM replicas, N `hotloop serve` nodes sharing it and HAProxy with
# deploy/haproxy.cfg's settings, all on 127.0.0.1, until Ctrl-C.
#
#   deploy/run-local.sh --nodes 3 --replicas 2
#
# It prints HAProxy's URL (point clients there), each node's URL and the path of
# HAProxy's runtime API socket. See docs/operations.md.
set -e
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || make develop
make -s haproxy services
exec .venv/bin/python -m hotloop.lab.cluster "$@"
