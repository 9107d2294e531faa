"""PopART logging: modules, levels, line format and environment variables
(spec §4.8, §8; F57, F58, F59, F95, F96, F97)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading

import pytest

import popart_backend as popart
from popart_backend import logging as plog

# 2022-05-18T12:39:14.459971Z popart:session 90915.90915 T: Session::weightsToHost
LINE = re.compile(
    r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6})Z (popart:\S+) (\d+)\.(\d+) ([TDIWEC]): (.*)$"
)


@pytest.fixture(autouse=True)
def restore_logging():
    yield
    plog.configure_from_env()


def lines(text: str) -> list[re.Match]:
    matches = [LINE.match(line) for line in text.splitlines() if line]
    assert all(matches), text
    return matches


def test_F57_modules_and_default_level(capsys):
    assert set(plog.MODULES) == {
        "popart", "session", "ir", "devicex", "transform", "pattern", "builder", "op", "opx",
        "ces", "python", "none",
    }
    assert plog.MODULES["none"] == "popart:<unknown>"
    plog.configure()
    for module in plog.MODULES:
        assert popart.getLogger(module).getLevel() == "WARN"
    logging.getLogger("popart:ir").info("hidden")
    logging.getLogger("popart:ir").warning("shown %d", 7)
    (m,) = lines(capsys.readouterr().err)
    assert (m.group(2), m.group(5), m.group(6)) == ("popart:ir", "W", "shown 7")


def test_F59_line_format(capsys):
    popart.getLogger().setLevel("TRACE")
    log = logging.getLogger("popart:session")
    log.log(plog.TRACE, "Session::weightsToHost")
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")
    log.critical("c")
    found = lines(capsys.readouterr().err)
    assert [m.group(5) for m in found] == ["T", "D", "I", "W", "E", "C"]
    first = found[0]
    assert first.group(2) == "popart:session" and first.group(6) == "Session::weightsToHost"
    assert int(first.group(3)) == os.getpid()
    assert int(first.group(4)) == threading.get_native_id()


def test_F58_python_logger_methods(capsys):
    logger = popart.getLogger()
    logger.setLevel("DEBUG")
    logger.debug("a")
    logger.info("b")
    logger.warn("c")
    logger.error("d")
    logger.critical("e")
    found = lines(capsys.readouterr().err)
    assert [(m.group(2), m.group(5), m.group(6)) for m in found] == [
        ("popart:python", "D", "a"),
        ("popart:python", "I", "b"),
        ("popart:python", "W", "c"),
        ("popart:python", "E", "d"),
        ("popart:python", "C", "e"),
    ]


def test_F58_per_module_levels(capsys):
    popart.getLogger(name="all").setLevel("DEBUG")
    popart.getLogger("session").setLevel("OFF")
    assert popart.getLogger("session").getLevel() == "OFF"
    assert popart.getLogger("ir").getLevel() == "DEBUG"
    logging.getLogger("popart:session").critical("silenced")
    logging.getLogger("popart:ir").debug("kept")
    popart.getLogger("popart:devicex").setLevel("ERR")  # prefixed name accepted
    logging.getLogger("popart:devicex").warning("below ERR")
    (m,) = lines(capsys.readouterr().err)
    assert m.group(6) == "kept"


def test_F57_unknown_module_and_level():
    with pytest.raises(popart.popart_exception, match="Unknown PopART log module 'sesion'"):
        popart.getLogger("sesion")
    with pytest.warns(UserWarning, match="Unknown PopART log level 'LOUD', using OFF"):
        popart.getLogger("ir").setLevel("LOUD")
    assert popart.getLogger("ir").getLevel() == "OFF"


def test_F96_dest_stdout_and_file(tmp_path, capsys):
    plog.configure_from_env({"POPART_LOG_DEST": "stdout", "POPART_LOG_LEVEL": "INFO"})
    logging.getLogger("popart:op").info("to stdout")
    out = capsys.readouterr()
    assert out.err == "" and lines(out.out)[0].group(6) == "to stdout"

    path = tmp_path / "popart.log"
    path.write_text("old content\n")
    plog.configure_from_env({"POPART_LOG_DEST": str(path)})
    logging.getLogger("popart:op").error("to file")
    plog.configure_from_env({})  # closes the file handler
    (m,) = lines(path.read_text())  # truncated on open
    assert (m.group(2), m.group(6)) == ("popart:op", "to file")


def test_F95_F97_level_and_config(tmp_path):
    config = tmp_path / "levels.json"
    config.write_text(json.dumps({"devicex": "INFO", "popart:session": "TRACE", "ir": "OFF"}))
    plog.configure_from_env({"POPART_LOG_LEVEL": "ERR", "POPART_LOG_CONFIG": str(config)})
    levels = {m: popart.getLogger(m).getLevel() for m in ("devicex", "session", "ir", "op")}
    assert levels == {"devicex": "INFO", "session": "TRACE", "ir": "OFF", "op": "ERR"}


def test_F97_bad_config_raises(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(popart.popart_exception, match="must hold a JSON object"):
        plog.configure_from_env({"POPART_LOG_CONFIG": str(bad)})
    with pytest.raises(popart.popart_exception, match="could not be read"):
        plog.configure_from_env({"POPART_LOG_CONFIG": str(tmp_path / "missing.json")})
    bad.write_text(json.dumps({"nosuchmodule": "INFO"}))
    with pytest.raises(popart.popart_exception, match="Unknown PopART log module"):
        plog.configure_from_env({"POPART_LOG_CONFIG": str(bad)})


def test_log_format_override(capsys):
    plog.configure_from_env({"POPART_LOG_FORMAT": "[%n] [%l] %v %q%%"})
    logging.getLogger("popart:devicex").warning("msg")
    assert capsys.readouterr().err == "[popart:devicex] [warning] msg %q%\n"


def test_F95_F96_env_read_at_import(tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"session": "OFF"}))
    env = dict(
        os.environ,
        POPART_LOG_LEVEL="DEBUG",
        POPART_LOG_DEST="stdout",
        POPART_LOG_CONFIG=str(config),
    )
    code = (
        "import logging, popart_backend\n"
        "logging.getLogger('popart:ir').debug('imported')\n"
        "logging.getLogger('popart:session').critical('off')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
        timeout=120,
    )
    found = lines(result.stdout)
    last = found[-1]
    assert (last.group(2), last.group(5), last.group(6)) == ("popart:ir", "D", "imported")
    assert "off" not in result.stdout and "off" not in result.stderr


def test_modules_log_their_work_at_trace(tmp_path):
    """F57-F59: with POPART_LOG_LEVEL=TRACE the session, builder and device modules log what
    they do, in PopART's line format."""
    import os
    import subprocess
    import sys

    script = (
        "import numpy as np, popart_backend as popart\n"
        "b = popart.Builder()\n"
        "x = b.addInputTensor('FLOAT', [2])\n"
        "y = b.aiOnnx.relu([x])\n"
        "b.addOutputTensor(y)\n"
        "d = popart.DeviceManager().acquireAvailableDevice(1)\n"
        "s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, [y]), d)\n"
        "s.prepareDevice()\n"
        "a = s.initAnchorArrays()\n"
        "s.run(popart.PyStepIO({x: np.ones(2, np.float32)}, a))\n"
        "d.detach()\n"
    )
    env = dict(os.environ, POPART_LOG_LEVEL="TRACE", POPART_LOG_DEST="stdout",
               PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    for logger, text in [("popart:builder", "Relu"), ("popart:session", "Session::prepareDevice"),
                         ("popart:session", "Session::run"), ("popart:devicex", "attach")]:
        assert any(logger in line and text in line for line in out.splitlines()), (logger, out)
