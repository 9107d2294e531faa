"""DeviceManager, DeviceInfo, SyncPattern and IpuSpec (spec §4.4, §5.4, App. A, App. B;
F40–F46, F76, F77, F113)."""

from __future__ import annotations

import gc

import pytest

import popart_backend as popart
from popart_backend.device.manager import check_sync_pattern
from popart_backend.device.spec import IpuSpec

KIB = 1024


@pytest.fixture(autouse=True)
def fresh_machine():
    """Every test starts and ends with the default 16-IPU machine and nothing attached."""
    manager = popart.DeviceManager()
    manager._detach_all()
    manager.setSimulatedMachine(16, "ipu2")
    manager.setOnDemandAttachTimeout(0)
    yield manager
    manager._detach_all()
    manager.setSimulatedMachine(16, "ipu2")
    manager.setOnDemandAttachTimeout(0)


# -- IpuSpec (App. A) --------------------------------------------------------------------------


def test_F113_ipu_spec_facts():
    ipu1, ipu2, bow = (IpuSpec.for_version(v) for v in ("ipu1", "ipu2", "ipu21"))
    assert (ipu1.num_tiles, ipu1.tile_bytes) == (1216, 256 * KIB)
    assert (ipu2.num_tiles, ipu2.tile_bytes) == (1472, 624 * KIB)
    assert (bow.num_tiles, bow.tile_bytes, bow.clock_hz) == (1472, 624 * KIB, 1.85e9)
    assert ipu1.threads_per_tile == ipu2.threads_per_tile == 6
    assert ipu1.peak_flops("f32") == 31.1e12 and ipu1.peak_flops("f16") == 124.5e12
    assert ipu2.peak_flops("f32") == 62.5e12 and ipu2.peak_flops("f16") == 250e12
    assert ipu2.exchange_bytes_per_s == 8e12 and ipu2.ipu_link_bytes_per_s == 320e9
    assert ipu2.memory_bytes == 1472 * 624 * KIB
    assert bow.peak_flops("f16") > ipu2.peak_flops("f16")
    for spec in (ipu1, ipu2, bow):
        assert spec.sync_latency_cycles > 0 and spec.streaming_memory_bytes > 0
        assert spec.host_link_bytes_per_s > 0


def test_F113_tiles_override_keeps_per_tile_facts():
    full = IpuSpec.for_version("ipu2")
    few = IpuSpec.for_version("ipu2", tiles_per_ipu=4)
    assert (few.num_tiles, few.tile_bytes, few.clock_hz) == (4, full.tile_bytes, full.clock_hz)
    assert few.peak_flops("f32") == pytest.approx(full.peak_flops("f32") * 4 / 1472)
    assert few.full_chip_tiles == 1472
    with pytest.raises(popart.popart_exception, match="tilesPerIPU=2000 is out of range"):
        IpuSpec.for_version("ipu2", 2000)
    with pytest.raises(popart.popart_exception, match="Unknown IPU version 'ipu3'"):
        IpuSpec.for_version("ipu3")
    with pytest.raises(AttributeError):
        full.num_tiles = 3  # frozen


# -- host devices (F40, F41) -------------------------------------------------------------------


def test_F40_singleton_and_cpu_device():
    assert popart.DeviceManager() is popart.DeviceManager()
    cpu = popart.DeviceManager().createCpuDevice()
    assert cpu.type is popart.DeviceType.Cpu
    assert (cpu.numIpus, cpu.tilesPerIPU, cpu.isAttached) == (1, 1, True)
    assert cpu.connectionType is popart.DeviceConnectionType.Always
    assert cpu.spec.name == "cpu"


def test_F41_ipu_model_defaults():
    dev = popart.DeviceManager().createIpuModelDevice({})
    assert dev.type is popart.DeviceType.IpuModel
    assert (dev.numIpus, dev.tilesPerIPU, dev.tilesPerIpu, dev.version) == (1, 4, 4, "ipu2")
    assert dev.numWorkerContexts == 6 and dev.isAttached
    assert dev.spec == IpuSpec.for_version("ipu2", 4)
    assert dev.options["compileIPUCode"] is True
    assert dev.driverIds == []


def test_F41_ipu_model_values_as_str_int_bool():
    manager = popart.DeviceManager()
    dev = manager.createIpuModelDevice(
        {"numIPUs": "2", "tilesPerIPU": 16, "ipuVersion": "ipu1", "compileIPUCode": "false"}
    )
    assert (dev.numIpus, dev.tilesPerIPU, dev.version) == (2, 16, "ipu1")
    assert dev.options["compileIPUCode"] is False
    assert dev.spec.tile_bytes == 256 * KIB
    assert manager.createIpuModelDevice({"ipuVersion": "ipu21"}).spec.clock_hz == 1.85e9


def test_F41_unknown_key_message():
    with pytest.raises(popart.popart_exception) as info:
        popart.DeviceManager().createIpuModelDevice({"numIpus": 2})
    assert str(info.value) == (
        "Invalid option `numIpus' passed to DevicexManager::createHostDevice for device type "
        "IpuModel. Valid options are [numIPUs, tilesPerIPU, ipuVersion, compileIPUCode]."
    )


@pytest.mark.parametrize(
    "opts, match",
    [
        ({"numIPUs": "two"}, "option `numIPUs' expects a int"),
        ({"numIPUs": 0}, "numIPUs must be at least 1"),
        ({"compileIPUCode": 1}, "option `compileIPUCode' expects a bool"),
        ({"ipuVersion": "cpu"}, "unknown ipuVersion 'cpu'"),
        ({"tilesPerIPU": 5000}, "out of range"),
    ],
)
def test_F41_bad_values(opts, match):
    with pytest.raises(popart.popart_exception, match=match):
        popart.DeviceManager().createIpuModelDevice(opts)


def test_sim_and_offline_devices():
    manager = popart.DeviceManager()
    sim = manager.createSimDevice({"numIPUs": 2})
    assert sim.type is popart.DeviceType.Sim and sim.tilesPerIPU == 4 and sim.numIpus == 2
    with pytest.raises(popart.popart_exception, match="for device type Sim"):
        manager.createSimDevice({"bogus": 1})
    offline = manager.createOfflineIPUDevice({"syncPattern": "singlePipeline"})
    assert offline.type is popart.DeviceType.OfflineIpu
    assert offline.connectionType is popart.DeviceConnectionType.Never
    assert offline.tilesPerIPU == 1472 and offline.syncPattern is popart.SyncPattern.SinglePipeline
    assert offline.attach() is False and not offline.isAttached
    assert offline.tryAttachUntilTimeout() is False


# -- the simulated machine (F42–F45) -----------------------------------------------------------


def test_F42_enumerate_ids_follow_gc_info_order():
    manager = popart.DeviceManager()
    singles = manager.enumerateDevices(numIpus=1)
    assert [d.id for d in singles] == list(range(16))
    pairs = manager.enumerateDevices(numIpus=2)
    assert [d.id for d in pairs] == list(range(16, 24))
    assert pairs[1].driverIds == [2, 3]
    assert [d.id for d in manager.enumerateDevices(numIpus=4)] == [24, 25, 26, 27]
    assert [d.id for d in manager.enumerateDevices(numIpus=8)] == [28, 29]
    (whole,) = manager.enumerateDevices(numIpus=16)
    assert (whole.id, whole.driverIds, whole.tilesPerIPU) == (30, list(range(16)), 1472)
    assert not any(d.isAttached for d in singles)
    assert manager.enumerateDevices(numIpus=3) == []
    assert manager.enumerateDevices(tilesPerIPU=4) == []
    assert len(manager.enumerateDevices(tilesPerIPU=1472)) == 16
    assert manager.enumerateDevices(deviceType=popart.DeviceType.IpuModel) == []


def test_F43_acquire_attaches_and_groups_are_exclusive():
    manager = popart.DeviceManager()
    first = manager.acquireAvailableDevice(1)
    assert first.id == 0 and first.isAttached and first.type is popart.DeviceType.Ipu
    pair = manager.acquireAvailableDevice(2)
    assert pair.id == 17 and pair.driverIds == [2, 3]  # {0,1} overlaps IPU 0
    assert manager.acquireAvailableDevice(16) is None
    assert manager.acquireDeviceById(16) is None  # IPUs 0,1 (0 is attached)
    assert manager.acquireDeviceById(2) is None  # inside the attached pair
    first.detach()
    assert not first.isAttached
    assert manager.acquireDeviceById(16).driverIds == [0, 1]


def test_F43_machine_runs_out():
    manager = popart.DeviceManager()
    held = [manager.acquireAvailableDevice(4) for _ in range(4)]
    assert [d.id for d in held] == [24, 25, 26, 27]
    assert manager.acquireAvailableDevice(4) is None
    assert manager.acquireAvailableDevice(1) is None
    assert manager.acquireAvailableDevice(32) is None
    held[2].detach()
    assert manager.acquireAvailableDevice(1).id == 8


def test_F43_tiles_random_and_errors():
    manager = popart.DeviceManager()
    dev = manager.acquireAvailableDevice(1, tilesPerIpu=64)
    assert dev.tilesPerIPU == 64 and dev.spec.tile_bytes == 624 * KIB
    chosen = manager.acquireAvailableDevice(
        2, selectionCriterion=popart.DeviceSelectionCriterion.Random
    )
    assert chosen.numIpus == 2 and 0 not in chosen.driverIds
    with pytest.raises(popart.popart_exception, match="numIpus=3 is not a power of two"):
        manager.acquireAvailableDevice(3)
    with pytest.raises(popart.popart_exception, match="no device with id 31"):
        manager.acquireDeviceById(31)


def test_F44_acquire_by_id_properties():
    dev = popart.DeviceManager().acquireDeviceById(25)
    assert (dev.id, dev.numIpus, dev.driverIds, dev.version) == (25, 4, [4, 5, 6, 7], "ipu2")
    assert dev.isAttached and dev.connectionType is popart.DeviceConnectionType.Always
    assert repr(dev) == (
        "Device Type:Ipu Connection Type:Always Id:25 Version:ipu2 NumIPUs:4 NumTilesPerIPU:1472"
    )


def test_F45_on_demand_attaches_later():
    manager = popart.DeviceManager()
    dev = manager.acquireAvailableDevice(
        1, connectionType=popart.DeviceConnectionType.OnDemand
    )
    assert dev.id == 0 and not dev.isAttached
    blocker = manager.acquireDeviceById(0)  # someone else takes the IPU meanwhile
    assert dev.tryAttachUntilTimeout() is False
    blocker.detach()
    assert dev.tryAttachUntilTimeout() is True and dev.isAttached


def test_F45_attach_timeout_validation():
    manager = popart.DeviceManager()
    manager.setOnDemandAttachTimeout(5)
    with pytest.raises(popart.popart_exception, match="non-negative int"):
        manager.setOnDemandAttachTimeout(-1)


def test_F46_context_manager_detaches():
    manager = popart.DeviceManager()
    with manager.acquireAvailableDevice(8) as dev:
        assert dev.isAttached and dev.driverIds == list(range(8))
        assert manager.acquireDeviceById(0) is None
    assert not dev.isAttached
    assert manager.acquireDeviceById(0) is not None


def test_F46_dropped_device_frees_its_ipus():
    manager = popart.DeviceManager()
    dev = manager.acquireAvailableDevice(16)
    assert manager.acquireAvailableDevice(1) is None
    del dev
    gc.collect()
    assert manager.acquireAvailableDevice(1) is not None


def test_machine_is_configurable():
    manager = popart.DeviceManager()
    manager.setSimulatedMachine(4, "ipu21")
    assert [d.id for d in manager.enumerateDevices(numIpus=4)] == [6]
    held = manager.acquireDeviceById(0)
    assert held.version == "ipu21"
    with pytest.raises(popart.popart_exception, match="Detach every device"):
        manager.setSimulatedMachine(8)
    held.detach()
    with pytest.raises(popart.popart_exception, match="power-of-two"):
        manager.setSimulatedMachine(6)


# -- SyncPattern (F76, F77) --------------------------------------------------------------------


def test_F76_sync_pattern_strings():
    for name, pattern in [
        ("full", popart.SyncPattern.Full),
        ("singlePipeline", popart.SyncPattern.SinglePipeline),
        ("replicaAndLadder", popart.SyncPattern.ReplicaAndLadder),
    ]:
        assert popart.syncPatternFromString(name) is pattern
        assert popart.syncPatternToString(pattern) == name
    with pytest.raises(popart.popart_exception, match="Unknown syncPattern 'Full'"):
        popart.syncPatternFromString("Full")


def test_F76_machine_devices_take_any_pattern():
    dev = popart.DeviceManager().acquireAvailableDevice(
        4, pattern=popart.SyncPattern.ReplicaAndLadder
    )
    assert dev.syncPattern is popart.SyncPattern.ReplicaAndLadder


def test_F77_host_devices_only_full():
    manager = popart.DeviceManager()
    for device_type in (popart.DeviceType.Cpu, popart.DeviceType.IpuModel, popart.DeviceType.Sim):
        check_sync_pattern(device_type, popart.SyncPattern.Full)
        with pytest.raises(popart.popart_exception, match="Only SyncPattern::Full is supported"):
            manager.enumerateDevices(
                pattern=popart.SyncPattern.SinglePipeline, deviceType=device_type
            )
    assert manager.createIpuModelDevice({}).syncPattern is popart.SyncPattern.Full
