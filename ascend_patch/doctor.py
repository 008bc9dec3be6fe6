"""``ascend-patch doctor``: versions, devices, and which target auto would pick and why.

Nothing here imports torch_npu (or even torch) in this process: probes run in a
child interpreter, because torch_npu installed on a host without CANN makes
``import torch`` itself fail (torch auto-loads it as a device backend).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

__all__ = ["Diagnosis", "diagnose", "format_diagnosis"]

_PROBE = r"""
import json, os, sys
out = {}
try:
    import torch
    out["torch_import"] = "ok"
    out["torch_version"] = torch.__version__
    out["cuda_built"] = bool(torch.backends.cuda.is_built())
    out["cuda_devices"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
except Exception as exc:
    out["torch_import"] = f"{type(exc).__name__}: {exc}"
if out.get("torch_import") == "ok" and sys.argv[1] == "1":
    try:
        import torch_npu
        out["torch_npu_import"] = "ok"
        out["npu_devices"] = torch.npu.device_count()
    except Exception as exc:
        out["torch_npu_import"] = f"{type(exc).__name__}: {exc}"
if out.get("torch_import") == "ok":
    try:
        from ascend_patch.cpu_host import device_source
        out["cpu_devices"] = list(device_source())
    except Exception as exc:
        out["cpu_devices"] = [0, "%s: %s" % (type(exc).__name__, exc)]
    try:
        from ascend_patch.plugins import get_plugin_manager
        from ascend_patch.models.registry import get_spec_registry
        from ascend_patch.loaders.formats import get_format_registry
        pm = get_plugin_manager()
        made = {}
        for spec in get_spec_registry().specs():
            made.setdefault(spec.owner, []).append("spec " + spec.name)
        formats = get_format_registry()
        for kind in ("loader", "saver"):
            for obj in formats.all(kind):
                made.setdefault(formats.plugin_of(kind, obj.name), []).append(kind + " " + obj.name)
        for name in pm.names():
            hooks = [h.name for h in pm.pm.get_hookcallers(pm.pm.get_plugin(name)) or ()]
            if "ascend_patch_register_patches" in hooks:
                made.setdefault(name, []).insert(0, "patches")
        out["plugins"] = [[name, pm.origins.get(name, ""), made.get(name, [])] for name in pm.names()]
        out["plugin_failures"] = [str(f) for f in pm.failures]
    except Exception as exc:
        out["plugin_failures"] = ["listing plugins failed: %s: %s" % (type(exc).__name__, exc)]
print(json.dumps(out))
"""

_CANN_VERSION_FILES = (
    "{home}/version.cfg",
    "{home}/compiler/version.info",
    "{home}/runtime/version.info",
)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cann() -> tuple[str | None, str | None]:
    """(CANN home, version) from the usual environment and install locations."""
    candidates = [os.environ.get(v) for v in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH", "ASCEND_OPP_PATH")]
    candidates += ["/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann/latest"]
    for home in candidates:
        if not home or not os.path.isdir(home):
            continue
        home = home.rstrip("/")
        if home.endswith("/opp"):
            home = home[:-4]
        for pattern in _CANN_VERSION_FILES:
            path = pattern.format(home=home)
            try:
                with open(path) as f:
                    for line in f:
                        if "version" in line.lower() and "=" in line:
                            return home, line.split("=", 1)[1].strip()
            except OSError:
                continue
        return home, "unknown version"
    return None, None


@dataclass
class Diagnosis:
    python: str
    versions: dict[str, str | None]
    cann_home: str | None
    cann_version: str | None
    probe: dict[str, object]
    target: str
    why: str
    advice: list[str] = field(default_factory=list)
    megatron: str = ""  # which megatron-core the process would import, from where, and whether it is supported


def diagnose(timeout: float = 120.0) -> Diagnosis:
    versions = {d: _version(d) for d in ("torch", "torch_npu", "megatron-core", "transformers",
                                          "safetensors", "pluggy", "wrapt", "ascend_patch")}
    cann_home, cann_version = _cann()
    npu_installed = importlib.util.find_spec("torch_npu") is not None
    env = dict(os.environ, ASCEND_PATCH="0")
    probe: dict[str, object] = {}
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE, "1" if npu_installed else "0"],
                              capture_output=True, text=True, timeout=timeout, env=env)
        last = (done.stdout.strip().splitlines() or ["{}"])[-1]
        probe = json.loads(last)
        if done.returncode != 0 and not probe:
            probe = {"torch_import": f"the probe exited with {done.returncode}: {done.stderr.strip()[-300:]}"}
    except (subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        probe = {"torch_import": f"probe failed: {exc}"}
    advice: list[str] = []
    device = os.environ.get("ASCEND_PATCH_DEVICE", "auto")
    if probe.get("torch_import") != "ok":
        if npu_installed and cann_home is None:
            advice.append(
                "torch_npu is installed but CANN was not found: torch auto-loads torch_npu as a device "
                "backend, so `import torch` itself fails. On an Ascend host, install CANN and source "
                "its set_env.sh; elsewhere, uninstall torch_npu (the npu extra is for Ascend hosts only) "
                "or set TORCH_DEVICE_BACKEND_AUTOLOAD=0.")
        target, why = "none", f"torch does not import: {probe.get('torch_import')}"
    elif device in ("cpu", "npu"):
        target, why = device, f"ASCEND_PATCH_DEVICE={device}"
    elif probe.get("torch_npu_import") == "ok" and int(probe.get("npu_devices", 0) or 0) > 0:
        target, why = "npu", f"torch_npu sees {probe['npu_devices']} NPU device(s)"
    elif int(probe.get("cuda_devices", 0) or 0) > 0:
        target, why = "none", (f"{probe['cuda_devices']} real CUDA device(s) and no NPU: auto leaves the "
                               "process unpatched (ASCEND_PATCH_DEVICE=cpu forces the cpu target)")
    else:
        reason = "torch_npu is not installed" if not npu_installed else \
            f"torch_npu did not import: {probe.get('torch_npu_import')}" \
            if probe.get("torch_npu_import") != "ok" else "torch_npu sees no NPU device"
        target, why = "cpu", f"{reason}; the cpu target runs everything on the host"
        if npu_installed and probe.get("torch_npu_import") != "ok" and cann_home is None:
            advice.append("CANN was not found: install it and `source .../ascend-toolkit/set_env.sh`.")
    if versions.get("torch_npu") and versions.get("torch"):
        tv, nv = versions["torch"] or "", versions["torch_npu"] or ""
        if tv.split("+")[0].split(".")[:2] != nv.split(".post")[0].split(".")[:2]:
            advice.append(f"torch {tv} and torch_npu {nv} are not a matching pair; install the torch_npu "
                          "release built for this torch.")
    return Diagnosis(sys.version.split()[0], versions, cann_home, cann_version, probe, target, why, advice,
                     _megatron())


def _megatron() -> str:
    """The megatron-core this interpreter would import (a checkout first on sys.path included) and its standing."""
    from .adaptors.megatron import releases
    from .adaptors.megatron.detect import find_megatron

    found = find_megatron()
    if found is None:
        return "not found"
    standing = ("supported" if releases.supported(found.version) else
                f"outside the supported releases ({releases.supported_text()}): patched on a best-effort basis")
    return f"{found.describe().removeprefix('megatron-core ')}: {standing}"


def format_diagnosis(d: Diagnosis) -> str:
    lines = ["ascend_patch doctor", "", f"python          {d.python}"]
    for dist, version in d.versions.items():
        shown = d.megatron if dist == "megatron-core" and d.megatron else version or "not installed"
        lines.append(f"{dist:<16}{shown}")
    lines.append(f"{'CANN':<16}{(d.cann_version + ' at ' + d.cann_home) if d.cann_home else 'not found'}")
    lines.append("")
    lines.append(f"import torch    {d.probe.get('torch_import', '?')}")
    if "torch_npu_import" in d.probe:
        lines.append(f"import torch_npu {d.probe['torch_npu_import']}")
    lines.append(f"NPU devices     {d.probe.get('npu_devices', 0)}")
    lines.append(f"CUDA devices    {d.probe.get('cuda_devices', 0)}")
    plugins = d.probe.get("plugins") or []
    for i, (name, origin, made) in enumerate(plugins):
        label = "plugins" if i == 0 else ""
        lines.append(f"{label:<16}{name} ({origin or '?'}): {', '.join(made) or 'no contributions'}")
    for failure in d.probe.get("plugin_failures") or []:
        lines.append(f"{'plugin failure':<16}{failure}")
    lines.append("")
    lines.append(f"target (auto)   {d.target}: {d.why}")
    if d.target == "cpu" and d.probe.get("cpu_devices"):
        count, why = d.probe["cpu_devices"]
        hint = "; ASCEND_PATCH_CPU_DEVICES=N presents N" if why.startswith("the default") else ""
        lines.append(f"{'cpu devices':<16}{count} virtual ({why}{hint})")
    for item in d.advice:
        lines.append(f"advice          {item}")
    return "\n".join(lines)
