"""Device selection (Appendix B).

``DeviceManager`` hands out ``DeviceInfo`` objects: host-emulated devices (CPU, IpuModel, Sim),
offline devices (compile only) and groups of a simulated IPU machine (by default 16 ``ipu2``
IPUs). Machine device ids follow ``gc-info``: single IPUs first, then 2-, 4-, 8-, ... IPU
groups. Attaching a group makes its IPUs busy for every overlapping group in this process.
"""

from __future__ import annotations

import enum
import logging
import random
import time
import weakref
from typing import Any, Mapping

from ..errors import popart_exception
from .spec import IPU_VERSIONS, IpuSpec

_log = logging.getLogger("popart:devicex")

__all__ = [
    "DeviceConnectionType",
    "DeviceInfo",
    "DeviceManager",
    "DeviceSelectionCriterion",
    "DeviceType",
    "SyncPattern",
    "syncPatternFromString",
    "syncPatternToString",
]


class DeviceType(enum.Enum):
    IpuModel = 0
    Cpu = 1
    Ipu = 2
    OfflineIpu = 3
    Sim = 4


class DeviceConnectionType(enum.Enum):
    Always = 0
    OnDemand = 1
    Never = 2


class DeviceSelectionCriterion(enum.Enum):
    First = 0
    Random = 1


class SyncPattern(enum.Enum):
    Full = 0
    SinglePipeline = 1
    ReplicaAndLadder = 2


_SYNC_PATTERN_NAMES = {
    SyncPattern.Full: "full",
    SyncPattern.SinglePipeline: "singlePipeline",
    SyncPattern.ReplicaAndLadder: "replicaAndLadder",
}


def syncPatternFromString(name: str) -> SyncPattern:  # noqa: N802 - PopART's name
    for pattern, text in _SYNC_PATTERN_NAMES.items():
        if text == name:
            return pattern
    raise popart_exception(
        f"Unknown syncPattern '{name}'. Valid values are {list(_SYNC_PATTERN_NAMES.values())}."
    )


def syncPatternToString(pattern: SyncPattern) -> str:  # noqa: N802
    return _SYNC_PATTERN_NAMES[pattern]


# Device types whose "IPUs" are emulated on the host: Poplar only supports the Full pattern there.
_HOST_DEVICE_TYPES = (DeviceType.Cpu, DeviceType.IpuModel, DeviceType.Sim)


def check_sync_pattern(device_type: DeviceType, pattern: SyncPattern) -> None:
    """Raise unless ``pattern`` is usable on ``device_type``."""
    if not isinstance(pattern, SyncPattern):
        raise popart_exception(f"pattern must be a SyncPattern, got {pattern!r}.")
    if device_type in _HOST_DEVICE_TYPES and pattern is not SyncPattern.Full:
        raise popart_exception(
            f"Only SyncPattern::Full is supported on {device_type.name} devices, got "
            f"SyncPattern::{pattern.name}."
        )


class DeviceInfo:
    """One device: what the session runs on. Read-only properties follow PopART."""

    def __init__(
        self,
        manager: DeviceManager,
        device_type: DeviceType,
        device_id: int,
        spec: IpuSpec,
        num_ipus: int,
        connection_type: DeviceConnectionType = DeviceConnectionType.Always,
        driver_ids: tuple[int, ...] = (),
        sync_pattern: SyncPattern = SyncPattern.Full,
        options: Mapping[str, Any] | None = None,
    ):
        self._manager = manager
        self._type = device_type
        self._id = device_id
        self._spec = spec
        self._num_ipus = num_ipus
        self._connection_type = connection_type
        self._driver_ids = tuple(driver_ids)
        self._sync_pattern = sync_pattern
        self._options = dict(options or {})
        self._attached = False

    # -- properties ----------------------------------------------------------------------------
    @property
    def type(self) -> DeviceType:
        return self._type

    @property
    def connectionType(self) -> DeviceConnectionType:  # noqa: N802
        return self._connection_type

    @property
    def version(self) -> str:
        """The IPU architecture name, e.g. ``"ipu2"`` (``"cpu"`` for the CPU device)."""
        return self._spec.name

    @property
    def ipuVersion(self) -> str:  # noqa: N802 - PopART's name
        """The IPU architecture, e.g. ``"ipu2"``."""
        return self._spec.name

    @property
    def id(self) -> int:
        return self._id

    @property
    def numIpus(self) -> int:  # noqa: N802
        return self._num_ipus

    @property
    def tilesPerIPU(self) -> int:  # noqa: N802
        return self._spec.num_tiles

    tilesPerIpu = tilesPerIPU

    @property
    def driverIds(self) -> list[int]:  # noqa: N802
        return list(self._driver_ids)

    @property
    def isAttached(self) -> bool:  # noqa: N802
        return self._attached

    @property
    def numWorkerContexts(self) -> int:  # noqa: N802
        return self._spec.threads_per_tile

    @property
    def spec(self) -> IpuSpec:
        """Hardware facts of one IPU of this device (tile count already applied)."""
        return self._spec

    @property
    def syncPattern(self) -> SyncPattern:  # noqa: N802
        return self._sync_pattern

    @property
    def options(self) -> dict[str, Any]:
        """The creation options (e.g. ``compileIPUCode`` of an IpuModel), already converted."""
        return dict(self._options)

    # -- attach / detach -----------------------------------------------------------------------
    def attach(self) -> bool:
        """Try to attach once; False if an overlapping device is attached or this is offline."""
        if self._connection_type is DeviceConnectionType.Never:
            return False
        if not self._attached:
            self._attached = self._manager._try_lock(self)
            _log.debug("attach %r: %s", self, "attached" if self._attached else "busy")
        return self._attached

    def detach(self) -> None:
        if self._attached:
            self._manager._unlock(self)
            self._attached = False
            _log.debug("detached %r", self)

    def tryAttachUntilTimeout(self) -> bool:  # noqa: N802
        """Retry ``attach()`` until the manager's on-demand attach timeout (seconds) expires."""
        deadline = time.monotonic() + self._manager._attach_timeout_s
        while not self.attach():
            if time.monotonic() >= deadline or self._connection_type is DeviceConnectionType.Never:
                return False
            time.sleep(0.05)
        return True

    def __enter__(self) -> DeviceInfo:
        return self

    def __exit__(self, *exc_info) -> None:
        self.detach()

    def __repr__(self) -> str:
        return (
            f"Device Type:{self._type.name} Connection Type:{self._connection_type.name} "
            f"Id:{self._id} Version:{self.version} NumIPUs:{self._num_ipus} "
            f"NumTilesPerIPU:{self.tilesPerIPU}"
        )


def _is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


class DeviceManager:
    """Process-wide singleton that creates and hands out devices."""

    _instance: DeviceManager | None = None

    def __new__(cls) -> DeviceManager:
        if cls._instance is None:
            instance = super().__new__(cls)
            instance._attach_timeout_s = 0
            # IPU index of the simulated machine -> the DeviceInfo attached to it (weakly held,
            # so a dropped DeviceInfo frees its IPUs like PopART's destructor does).
            instance._locks: dict[int, weakref.ref] = {}
            instance._random = random.Random()
            instance.setSimulatedMachine(16, "ipu2")
            cls._instance = instance
        return cls._instance

    # -- the simulated machine -----------------------------------------------------------------
    def setSimulatedMachine(  # noqa: N802
        self,
        numIpus: int = 16,  # noqa: N803
        ipuVersion: str = "ipu2",  # noqa: N803
    ) -> None:
        """Model a machine of ``numIpus`` (a power of two) IPUs of ``ipuVersion``."""
        if not isinstance(numIpus, int) or not _is_power_of_two(numIpus):
            raise popart_exception(
                f"The simulated machine needs a power-of-two number of IPUs, got {numIpus!r}."
            )
        if any(self._holder(i) is not None for i in self._locks):
            raise popart_exception("Detach every device before changing the simulated machine.")
        self._machine_spec = IpuSpec.for_version(ipuVersion)
        self._machine_ipus = numIpus
        groups = []  # (device id, driver ids); singles first, then 2-, 4-, ... IPU groups
        size = 1
        while size <= numIpus:
            for start in range(0, numIpus, size):
                groups.append((len(groups), tuple(range(start, start + size))))
            size *= 2
        self._groups = groups

    def _holder(self, ipu: int) -> DeviceInfo | None:
        ref = self._locks.get(ipu)
        device = ref() if ref is not None else None
        return device if device is not None and device._attached else None

    def _group_free(self, driver_ids: tuple[int, ...]) -> bool:
        return all(self._holder(i) is None for i in driver_ids)

    def _try_lock(self, device: DeviceInfo) -> bool:
        if device.type is not DeviceType.Ipu:
            return True  # host devices are private to their DeviceInfo
        if not self._group_free(device._driver_ids):
            return False
        for ipu in device._driver_ids:
            self._locks[ipu] = weakref.ref(device)
        return True

    def _unlock(self, device: DeviceInfo) -> None:
        for ipu in device._driver_ids:
            if self._holder(ipu) is device:
                del self._locks[ipu]

    def _machine_device(
        self,
        device_id: int,
        pattern: SyncPattern,
        connection_type: DeviceConnectionType,
        tiles_per_ipu: int,
    ) -> DeviceInfo:
        _, driver_ids = self._groups[device_id]
        if not isinstance(connection_type, DeviceConnectionType):
            raise popart_exception(
                f"connectionType must be a DeviceConnectionType, got {connection_type!r}."
            )
        check_sync_pattern(DeviceType.Ipu, pattern)
        spec = IpuSpec.for_version(self._machine_spec.name, tiles_per_ipu or None)
        return DeviceInfo(
            self, DeviceType.Ipu, device_id, spec, len(driver_ids), connection_type, driver_ids,
            pattern,
        )

    # -- enumerate / acquire -------------------------------------------------------------------
    def enumerateDevices(  # noqa: N802
        self,
        pattern: SyncPattern = SyncPattern.Full,
        numIpus: int = 1,  # noqa: N803
        deviceType: DeviceType = DeviceType.Ipu,  # noqa: N803
        connectionType: DeviceConnectionType = DeviceConnectionType.Always,  # noqa: N803
        tilesPerIPU: int = 0,  # noqa: N803
    ) -> list[DeviceInfo]:
        """Every machine device of ``numIpus`` IPUs (busy ones included); ``tilesPerIPU=0``
        means any. Host device types are created, not enumerated, so they give an empty list."""
        check_sync_pattern(deviceType, pattern)
        if deviceType is not DeviceType.Ipu:
            return []
        if tilesPerIPU not in (0, self._machine_spec.num_tiles):
            return []
        return [
            self._machine_device(device_id, pattern, connectionType, 0)
            for device_id, driver_ids in self._groups
            if len(driver_ids) == numIpus
        ]

    def acquireAvailableDevice(  # noqa: N802
        self,
        numIpus: int = 1,  # noqa: N803
        tilesPerIpu: int = 0,  # noqa: N803
        pattern: SyncPattern = SyncPattern.Full,
        connectionType: DeviceConnectionType = DeviceConnectionType.Always,  # noqa: N803
        selectionCriterion: DeviceSelectionCriterion = DeviceSelectionCriterion.First,  # noqa: N803
    ) -> DeviceInfo | None:
        """A free machine device of exactly ``numIpus`` IPUs, attached unless OnDemand/Never;
        None if every such device is busy or the machine has none that large."""
        if not isinstance(numIpus, int) or not _is_power_of_two(numIpus):
            raise popart_exception(
                f"acquireAvailableDevice: numIpus={numIpus!r} is not a power of two; IPUs are "
                "acquired in groups of 1, 2, 4, 8, ... IPUs."
            )
        if not isinstance(selectionCriterion, DeviceSelectionCriterion):
            raise popart_exception(
                "selectionCriterion must be a DeviceSelectionCriterion, got "
                f"{selectionCriterion!r}."
            )
        free = [
            device_id
            for device_id, driver_ids in self._groups
            if len(driver_ids) == numIpus and self._group_free(driver_ids)
        ]
        if not free:
            return None
        if selectionCriterion is DeviceSelectionCriterion.Random:
            device_id = self._random.choice(free)
        else:
            device_id = free[0]
        device = self._machine_device(device_id, pattern, connectionType, tilesPerIpu)
        if connectionType is DeviceConnectionType.Always and not device.attach():
            return None
        return device

    def acquireDeviceById(  # noqa: N802
        self,
        id: int,  # noqa: A002 - PopART's keyword
        pattern: SyncPattern = SyncPattern.Full,
        connectionType: DeviceConnectionType = DeviceConnectionType.Always,  # noqa: N803
        tilesPerIpu: int = 0,  # noqa: N803
    ) -> DeviceInfo | None:
        """Machine device ``id`` (as listed by ``enumerateDevices``); None if it is busy."""
        if not isinstance(id, int) or not 0 <= id < len(self._groups):
            raise popart_exception(
                f"acquireDeviceById: no device with id {id!r}; the simulated machine of "
                f"{self._machine_ipus} IPUs has ids 0..{len(self._groups) - 1}."
            )
        if not self._group_free(self._groups[id][1]):
            return None
        device = self._machine_device(id, pattern, connectionType, tilesPerIpu)
        if connectionType is DeviceConnectionType.Always and not device.attach():
            return None
        return device

    def tryAcquireAvailableDevice(self, *args, **kwargs) -> DeviceInfo | None:  # noqa: N802
        """``acquireAvailableDevice``'s arguments; None when no such device is free (which
        ``acquireAvailableDevice`` also returns here)."""
        return self.acquireAvailableDevice(*args, **kwargs)

    def tryAcquireDeviceById(self, *args, **kwargs) -> DeviceInfo | None:  # noqa: N802
        """``acquireDeviceById``'s arguments; None when that device is busy."""
        return self.acquireDeviceById(*args, **kwargs)

    def createOfflineIpuFromDeviceInfo(self, deviceInfo: DeviceInfo) -> DeviceInfo:  # noqa: N802,N803
        """A compile-only device of the same IPU version, IPU count, tiles and sync pattern."""
        if not isinstance(deviceInfo, DeviceInfo):
            raise popart_exception(
                f"createOfflineIpuFromDeviceInfo: expected a DeviceInfo, got "
                f"{type(deviceInfo).__name__}."
            )
        return self.createOfflineIPUDevice({
            "numIPUs": deviceInfo.numIpus, "tilesPerIPU": deviceInfo.tilesPerIPU,
            "ipuVersion": deviceInfo.version,
            "syncPattern": syncPatternToString(deviceInfo.syncPattern),
        })

    def createOfflineIpuFromSystemString(self, system: str, numIpus: int) -> DeviceInfo:  # noqa: N802,N803
        """A compile-only device of ``numIpus`` IPUs of the architecture ``system``
        (e.g. "ipu2")."""
        return self.createOfflineIPUDevice({"numIPUs": numIpus, "ipuVersion": system})

    def setOnDemandAttachTimeout(self, attachTimeout: int) -> None:  # noqa: N802,N803
        """Seconds an OnDemand device keeps retrying to attach."""
        valid = isinstance(attachTimeout, int) and not isinstance(attachTimeout, bool)
        if not valid or attachTimeout < 0:
            raise popart_exception(
                "setOnDemandAttachTimeout expects a non-negative int of seconds, got "
                f"{attachTimeout!r}."
            )
        self._attach_timeout_s = attachTimeout

    # -- host devices --------------------------------------------------------------------------
    def createCpuDevice(self) -> DeviceInfo:  # noqa: N802
        device = DeviceInfo(self, DeviceType.Cpu, 0, IpuSpec.for_version("cpu"), 1)
        device.attach()
        return device

    def createIpuModelDevice(  # noqa: N802
        self, opts: Mapping[str, Any] | None = None
    ) -> DeviceInfo:
        """An IPU-Model device; keys numIPUs (1), tilesPerIPU (4), ipuVersion ("ipu2"),
        compileIPUCode (True), values as str, int or bool."""
        return self._create_host_device(DeviceType.IpuModel, opts)

    def createSimDevice(self, opts: Mapping[str, Any] | None = None) -> DeviceInfo:  # noqa: N802
        """The cycle-accurate Sim device of Poplar; simulated exactly like an IpuModel."""
        return self._create_host_device(DeviceType.Sim, opts)

    def createOfflineIPUDevice(  # noqa: N802
        self, opts: Mapping[str, Any] | None = None
    ) -> DeviceInfo:
        """A compile-only device (connection Never); keys numIPUs (1), tilesPerIPU (the
        version's full chip), ipuVersion ("ipu2"), syncPattern ("full")."""
        values = _parse_device_options(
            "createOfflineIPUDevice",
            DeviceType.OfflineIpu,
            opts,
            {"numIPUs": 1, "tilesPerIPU": 0, "ipuVersion": "ipu2", "syncPattern": "full"},
        )
        spec = IpuSpec.for_version(values["ipuVersion"], values["tilesPerIPU"] or None)
        pattern = syncPatternFromString(values["syncPattern"])
        return DeviceInfo(
            self, DeviceType.OfflineIpu, 0, spec, values["numIPUs"], DeviceConnectionType.Never,
            (), pattern, values,
        )

    def _create_host_device(
        self, device_type: DeviceType, opts: Mapping[str, Any] | None
    ) -> DeviceInfo:
        values = _parse_device_options(
            "DevicexManager::createHostDevice",
            device_type,
            opts,
            {"numIPUs": 1, "tilesPerIPU": 4, "ipuVersion": "ipu2", "compileIPUCode": True},
        )
        spec = IpuSpec.for_version(values["ipuVersion"], values["tilesPerIPU"])
        device = DeviceInfo(
            self, device_type, 0, spec, values["numIPUs"], DeviceConnectionType.Always, (),
            SyncPattern.Full, values,
        )
        device.attach()
        return device

    def _detach_all(self) -> None:
        """Release every machine IPU of this process (test isolation)."""
        for ipu in list(self._locks):
            device = self._holder(ipu)
            if device is not None:
                device.detach()
        self._locks.clear()


def _parse_device_options(
    where: str, device_type: DeviceType, opts: Mapping[str, Any] | None, defaults: dict[str, Any]
) -> dict[str, Any]:
    """Fill ``defaults`` from ``opts``, converting "2"/"true" strings to the default's type."""
    values = dict(defaults)
    for key, raw in (opts or {}).items():
        if key not in defaults:
            raise popart_exception(
                f"Invalid option `{key}' passed to {where} for device type {device_type.name}. "
                f"Valid options are [{', '.join(defaults)}]."
            )
        values[key] = _convert_option(where, key, raw, type(defaults[key]))
    if values["ipuVersion"] not in IPU_VERSIONS:
        raise popart_exception(
            f"{where}: unknown ipuVersion '{values['ipuVersion']}'. Valid values are "
            f"{list(IPU_VERSIONS)}."
        )
    if values["numIPUs"] < 1:
        raise popart_exception(f"{where}: numIPUs must be at least 1, got {values['numIPUs']}.")
    return values


def _convert_option(where: str, key: str, raw: Any, kind: type) -> Any:
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "false"):
            return raw.lower() == "true"
    elif kind is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().isdigit():
            return int(raw)
    elif isinstance(raw, str):
        return raw
    raise popart_exception(
        f"{where}: option `{key}' expects a {kind.__name__} (or its string form), got {raw!r}."
    )
