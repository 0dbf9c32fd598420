#!/bin/sh
# A container that runs two CUDA processes at once, each growing to JOB_GIB GiB (gpu_job.py):
# what MPS's per-process pinned limit lets through, one container over its reservation.
python3 "$(dirname "$0")/gpu_job.py" &
python3 "$(dirname "$0")/gpu_job.py" &
wait
