#!/usr/bin/env bash
# aiscope's Slurm epilog: at job end, store the job's efficiency summary with the job, where
# jobstats sites keep theirs (the job's AdminComment), so `aiscope job ID` on a login node shows
# it without the node stores, and for as long as slurmdbd keeps the job.
#
#   slurm.conf, compute-node epilog (node-local stores; the job's first node writes):
#     Epilog=/etc/slurm/epilog.d/aiscope-epilog.sh
#   or slurmctld epilog, reading a fleet location every node publishes to:
#     EpilogSlurmctld=/etc/slurm/aiscope-epilog.sh   (with AISCOPE_STORE=/shared/aiscope-fleet)
#
# It stores `aiscope32:` + base32(gzip(JSON of `aiscope job ID --format json`)) with
# `scontrol update job=ID AdminComment=...`, else sacctmgr. slurmctld refuses updates of a job that
# has finished ("Job has already finished"), which it has when an epilog runs, so at job end it is
# sacctmgr (slurmdbd) that stores the comment, as jobstats' EpilogSlurmctld does. It never fails the job or drains the node: every path exits 0, and what happened
# goes to syslog (tag aiscope-epilog, `journalctl -t aiscope-epilog`).
#
# Settings (environment; e.g. in /etc/default/aiscope-epilog, read when present):
#   AISCOPE               the aiscope executable (default: aiscope on PATH)
#   AISCOPE_STORE         store file, directory or fleet location (default: /var/lib/aiscope)
#   AISCOPE_EPILOG_TIMEOUT  seconds the summary may take (default 60; slurm's EpilogMsgTime and
#                         the node's own epilog timeout must allow it)
#   AISCOPE_EPILOG_MAX_CHARS  the largest AdminComment to store (default 16000)
set -u

if [ -r /etc/default/aiscope-epilog ]; then
    # shellcheck source=/dev/null
    . /etc/default/aiscope-epilog
fi
AISCOPE="${AISCOPE:-aiscope}"
STORE="${AISCOPE_STORE:-/var/lib/aiscope}"
TIMEOUT="${AISCOPE_EPILOG_TIMEOUT:-60}"
MAX_CHARS="${AISCOPE_EPILOG_MAX_CHARS:-16000}"
JOB="${SLURM_JOB_ID:-}"
# An array task is updated as ARRAYID_TASKID, or every task of the array would share one comment.
if [ -n "${SLURM_ARRAY_JOB_ID:-}" ] && [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then
    TARGET="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
else
    TARGET="$JOB"
fi

log() {
    logger -t aiscope-epilog -- "job ${TARGET:-?}: $*" 2>/dev/null || echo "aiscope-epilog: job ${TARGET:-?}: $*" >&2
}

if [ -z "$JOB" ]; then
    log "SLURM_JOB_ID is not set: not run by Slurm, nothing to do"
    exit 0
fi

# In a compute-node epilog every node of the job runs this; with node-local stores only the
# job's first node writes, so the nodes do not overwrite each other's comment.
args=(job "$JOB" --store "$STORE" --format json --ended)
if [ "${SLURM_SCRIPT_CONTEXT:-epilog_slurmd}" != "epilog_slurmctld" ]; then
    first="$(scontrol show hostnames "${SLURM_JOB_NODELIST:-}" 2>/dev/null | head -n 1)"
    here="$(hostname -s)"
    if [ -n "$first" ] && [ "$first" != "$here" ]; then
        log "not the job's first node ($first); it stores the summary"
        exit 0
    fi
    if [ -n "${SLURM_JOB_GPUS:-}" ]; then
        args+=(--node "$here" --allocated-gpus "$SLURM_JOB_GPUS")
    fi
fi

errors="$(mktemp)" || { log "cannot create a temporary file"; exit 0; }
trap 'rm -f "$errors"' EXIT
summary="$(timeout --kill-after=5 "$TIMEOUT" "$AISCOPE" "${args[@]}" 2>"$errors")"
status=$?
if [ "$status" -ne 0 ]; then
    why="$(tail -n 1 "$errors")"
    [ "$status" -eq 124 ] && why="timed out after ${TIMEOUT}s"
    log "no summary (exit $status): $why"
    exit 0
fi

# base32, not base64: sacctmgr lowercases what it sets (Slurm 22.05), and base32 survives that.
comment="aiscope32:$(printf '%s' "$summary" | gzip -9 -n | base32 -w 0)"
if [ "${#comment}" -gt "$MAX_CHARS" ]; then
    log "summary of ${#comment} characters exceeds AISCOPE_EPILOG_MAX_CHARS=$MAX_CHARS; not stored"
    exit 0
fi

if out="$(scontrol update "job=$TARGET" "AdminComment=$comment" 2>&1)"; then
    log "stored a ${#comment}-character summary in AdminComment"
elif out2="$(sacctmgr -i update job where "jobid=$TARGET" set "AdminComment=$comment" 2>&1)"; then
    log "stored a ${#comment}-character summary in AdminComment (sacctmgr; scontrol said: $out)"
else
    log "could not store the summary: scontrol: $out; sacctmgr: $out2"
fi
exit 0
