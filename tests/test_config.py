"""Settings come from ASCEND_PATCH_* and reject bad values with a message naming the variable."""

import pytest

from ascend_patch.config import ConfigError, Settings, read_settings


def test_defaults():
    s = read_settings({})
    assert s == Settings()
    assert (s.enabled, s.device, s.strict, s.report, s.cuda_is_available) == (True, "auto", False, "0", True)
    assert s.disable_plugins == ()


def test_values_are_converted():
    s = read_settings({"ASCEND_PATCH": "0", "ASCEND_PATCH_DEVICE": "cpu", "ASCEND_PATCH_STRICT": "1",
                       "ASCEND_PATCH_REPORT": "all", "ASCEND_PATCH_CUDA_IS_AVAILABLE": "0",
                       "ASCEND_PATCH_DISABLE_PLUGINS": " ops, comm ,,", "ASCEND_PATCH_AUTOLOAD": "1",
                       "UNRELATED": "x"})
    assert (s.enabled, s.device, s.strict, s.report, s.cuda_is_available, s.autoload) == (
        False, "cpu", True, "all", False, True)
    assert s.disable_plugins == ("ops", "comm")
    assert s.report_enabled


@pytest.mark.parametrize("name,value,allowed", [
    ("ASCEND_PATCH_DEVICE", "gpu", "auto, npu, cpu"),
    ("ASCEND_PATCH", "yes", "0, 1"),
    ("ASCEND_PATCH_STRICT", "true", "0, 1"),
    ("ASCEND_PATCH_REPORT", "2", "0, 1, all"),
    ("ASCEND_PATCH_CPU_DEVICES", "0", "a positive integer"),
    ("ASCEND_PATCH_CPU_DEVICES", "eight", "a positive integer"),
])
def test_bad_value_names_variable_and_choices(name, value, allowed):
    with pytest.raises(ConfigError) as err:
        read_settings({name: value})
    assert f"{name}={value!r}" in str(err.value)
    assert allowed in str(err.value)


def test_unknown_variable_suggests_the_closest():
    with pytest.raises(ConfigError, match="unknown variable ASCEND_PATCH_DEVCE; did you mean ASCEND_PATCH_DEVICE"):
        read_settings({"ASCEND_PATCH_DEVCE": "cpu"})


def test_to_environ_round_trips():
    s = Settings(device="cpu", strict=True, report="all", cuda_is_available=False, disable_plugins=("a", "b"),
                 cpu_devices="8")
    assert read_settings(s.to_environ()) == s


def test_empty_value_means_unset():
    assert read_settings({"ASCEND_PATCH": "", "ASCEND_PATCH_DEVICE": " "}) == Settings()
