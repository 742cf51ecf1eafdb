#!/usr/bin/env bash
# Installs what tests/test_launch_slurm.py and tests/test_launch_ssh.py need: a real Slurm
# (controller, node daemon, client commands, munge authentication) and a real OpenSSH server and
# client. The tests start their own daemons inside network namespaces; nothing here starts or
# configures a service. Quiet and idempotent: it installs only what is missing, and says nothing
# unless apt fails (then it prints apt's output).
set -euo pipefail

packages=()
need() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || packages+=("$2"); }
need slurmctld slurmctld
need slurmd slurmd
need srun slurm-client
need salloc slurm-client
need munged munge
need sshd openssh-server
need ssh openssh-client
need ssh-keygen openssh-client

if [ ${#packages[@]} -gt 0 ]; then
  mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  if ! { apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}"; } >"$log" 2>&1
  then
    echo "install-launchers: apt-get install ${packages[*]} failed:" >&2
    cat "$log" >&2
    exit 1
  fi
fi
