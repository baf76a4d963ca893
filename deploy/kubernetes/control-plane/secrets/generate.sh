#!/bin/sh
# Writes the control plane's secrets beside this script, each a random value from
# /dev/urandom, for kustomization.yaml here:
#   nats.env            NATS_PASSWORD_<USER>=… for hub, api, cli and operator-<cluster> of
#                       each cluster named (the names `wingsmith nats-config` refers to)
#   postgres.env        password=…, and url=postgresql://… holding it (the event store)
#   api.env             tokens=admin:… (may write), read-tokens= (none yet)
#   operator-<id>.env   user=operator-<id>, password=… (its NATS login, for the cluster's
#                       Secret wingsmith-operator-nats)
# A file or password that exists is kept: run it again with a new cluster id to add one.
set -eu
[ $# -gt 0 ] || { echo "usage: $0 CLUSTER_ID..." >&2; exit 2; }
cd "$(dirname "$0")"
umask 077

random() { od -An -N24 -tx1 /dev/urandom | tr -d ' \n'; }
variable() { printf 'NATS_PASSWORD_%s' "$(printf '%s' "$1" | tr 'a-z-' 'A-Z_')"; }
password() { sed -n "s/^$(variable "$1")=//p" nats.env; }

for cluster in "$@"; do
  case $cluster in
    '' | -* | *- | *[!a-z0-9-]*)
      echo "$0: $cluster: a cluster id is a DNS label (a-z, 0-9, -)" >&2; exit 2 ;;
  esac
done
touch nats.env
for user in hub api cli $(printf 'operator-%s ' "$@"); do
  [ -n "$(password "$user")" ] || echo "$(variable "$user")=$(random)" >> nats.env
done
for cluster in "$@"; do
  [ -e "operator-$cluster.env" ] ||
    printf 'user=operator-%s\npassword=%s\n' "$cluster" "$(password "operator-$cluster")" \
      > "operator-$cluster.env"
done
if [ ! -e postgres.env ]; then
  secret=$(random)
  printf 'password=%s\nurl=postgresql://wingsmith:%s@postgres:5432/wingsmith\n' \
    "$secret" "$secret" > postgres.env
fi
[ -e api.env ] || printf 'tokens=admin:%s\nread-tokens=\n' "$(random)" > api.env
echo "secrets in $(pwd): nats.env postgres.env api.env $(printf 'operator-%s.env ' "$@")"
