"""Multi-node jobs: a consistent checkpoint of every rank of a Slurm job, on every node, and
its restore onto a new allocation (issue #17).

| file | concern |
|---|---|
| coordinator.py | the job command's side: srun the workers, two-phase commit, abort, deadlines, placement |
| worker.py | one per node (srun --overlap): the node's ranks as a process set, its vote, undo on abort |
| protocol.py | the wire: JSON lines with an HMAC under the job's secret, run id, sequence numbers |
| manifest.py | the job checkpoint directory (job.json, nodes/NODE/, rendezvous/), its load and verify |
| ranks.py | which processes on a node are the job's ranks (/proc: SLURM_JOB_ID, SLURM_STEP_ID, SLURM_PROCID) |
| slurm.py | what is asked of Slurm: the job's nodes and addresses, the workers' srun line |
"""
