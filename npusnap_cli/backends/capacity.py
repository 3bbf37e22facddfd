"""Before a restore starts anything: does this machine have the devices the checkpoint needs?

A restore that found out half-way (the process CRIU-restored, then no room on the
device) would have to kill what it just restored; checking first keeps the
machine untouched and says what is missing."""

from __future__ import annotations

from ..errors import DeviceFailed
from ..image.format import DeviceState
from ..output import human_bytes
from .base import BackendName


def fits(device: DeviceState) -> None:
    """Raise DeviceFailed unless the device side of the checkpoint can be restored here."""
    if device.backend == BackendName.SIM:
        _fits_sim(device)
    # ascend: CANN offers no query we could make from outside the process; cuda checks
    # its GPUs itself (--device-map) before the restore starts.


def _fits_sim(device: DeviceState) -> None:
    from ..platform import simdaemon

    sock = simdaemon.socket_path(device.endpoint)
    status = simdaemon.status(sock)
    if status is None:
        raise DeviceFailed(f"the checkpoint needs the npusim device daemon on {sock}, and none answers there",
                           f"start it: npusnap device start --socket {sock}")
    present = {int(d["id"]): d for d in status.get("devices", [])}
    missing = [d for d in device.devices if d not in present]
    if missing:
        raise DeviceFailed(f"the checkpoint used device {missing[0]}, but the daemon on {sock} has only "
                           f"{len(present)} device(s)", "restore on a machine with the same device ids")
    free = sum(int(present[d]["free"]) for d in device.devices)
    if device.bytes > free:
        raise DeviceFailed(f"the checkpoint needs {human_bytes(device.bytes)} of device memory, but devices "
                           f"{device.devices} have {human_bytes(free)} free",
                           "free device memory (stop other clients) or restore on another machine")
