#!/usr/bin/env bash
# Starts a single-node Slurm cluster on this machine (as root), for running
# udbtl programs under `srun --mpi=pmi2`. Idempotent; state lives in
# /var/tmp/udbtl-slurm. Usage: scripts/slurm-local.sh [stop]
set -euo pipefail
STATE=/var/tmp/udbtl-slurm
if [[ "${1:-}" == stop ]]; then
    pkill -x slurmd || true; pkill -x slurmctld || true; pkill -x munged || true
    exit 0
fi
if ! command -v slurmctld >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
fi
mkdir -p "$STATE"/{spool,ctld} /etc/slurm /run/munge
chown munge: /run/munge
[[ -s /etc/munge/munge.key ]] || { mkdir -p /etc/munge; dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; chown munge: /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
cpus=$(nproc)
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=udbtl
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:64
CONF
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
pgrep -x slurmctld >/dev/null || (slurmctld -D >"$STATE/ctld.out" 2>&1 &)
pgrep -x slurmd >/dev/null || (slurmd -D >"$STATE/d.out" 2>&1 &)
for _ in $(seq 1 60); do
    if grep -qE 'idle|mixed|alloc' <<<"$(sinfo -h -o %T 2>/dev/null)"; then
        echo "slurm: up"; exit 0
    fi
    sleep 0.5
done
echo "slurm: did not come up; see $STATE" >&2
exit 1
