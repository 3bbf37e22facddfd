"""npusnap's benchmark suite: physical limits, bare CRIU and npusnap side by side in one run.

    python -m bench            # full: CPU-only 64 MiB..4 GiB, 1 GiB host + 256 MiB..8 GiB device; plot
    python -m bench --quick    # CPU-only 64 and 256 MiB, 256 MiB host + 256 MiB device; about 2 minutes
    python -m bench --sizes tiny --output /tmp/r.json   # the smoke test's configuration
    python -m bench --quick --host-sizes 64M,1G --device-sizes 512M,2G   # a preset with other sizes

Every size is measured in the same run as the limits it is divided by; a size that does not
fit the machine's free memory, disk or tmpfs now is skipped with the reason (printed, and
under "skipped" in results.json). bench/results.png (full run, or --plot) draws throughput
against size for npusnap, bare CRIU and the limits; without matplotlib it says it skipped it.

Modules, one concern each:
    config    the size presets and size lists (--host-sizes, --device-sizes)
    util      cleanup of everything started, process and cache helpers, statistics
    limits    memcpy, fsync'd disk write, cold disk read, tmpfs
    cpuonly   bare `criu dump/restore` vs `npusnap checkpoint/restore --device none`
    device    npusnap on a device workload (workload.py) to disk and to tmpfs
    latency   agent round trip, `npusnap --help`
    report    targets, results.json, the terminal table, the plot
    _cli      runs the npusnap CLI in a child and reports its peak memory
    workload  the workload process itself (run as a script)
"""
