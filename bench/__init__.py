"""npusnap's benchmark suite: physical limits, bare CRIU and npusnap side by side in one run.

    python -m bench            # full: 1 GiB CPU-only, 1 GiB host + 1/2/4 GiB device; plot
    python -m bench --quick    # 256 MiB everywhere; under 2 minutes
    python -m bench --sizes tiny --output /tmp/r.json   # the smoke test's configuration

Modules, one concern each:
    config    the size presets
    util      cleanup of everything started, process and cache helpers, statistics
    limits    memcpy, fsync'd disk write, cold disk read, tmpfs
    cpuonly   bare `criu dump/restore` vs `npusnap checkpoint/restore --device none`
    device    npusnap on a device workload (workload.py) to disk and to tmpfs
    latency   agent round trip, `npusnap --help`
    report    targets, results.json, the terminal table, the plot
    _cli      runs the npusnap CLI in a child and reports its peak memory
    workload  the workload process itself (run as a script)
"""
