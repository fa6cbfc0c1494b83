"""Float32 products of a few rows: MKL's ``F.linear`` against oneDNN's packed weights (:mod:`lightning_bpd.kernels.onednn`).

    python -m lightning_bpd.benchmarks.onednn_products --out results/runtime/onednn_products.json [--note TEXT]

For each weight shape (in -> out) and row count (1, 2, 4, 8, 16, 32), times ``F.linear`` and
:class:`~lightning_bpd.kernels.onednn.PackedLinear` on ``--threads`` threads (median of many calls after a
warm-up, the two kernels alternated call by call) and records the medians and the 8-row / 1-row
ratio of each kernel. Checks for each kernel whether it is bitwise batch-invariant: row i of a
product of n rows (n = 1..32) equals row i of a 1-row product, at 1 and 2 threads (``packed_unpadded``
is the raw oneDNN product without PackedLinear's 1-row padding for in > 1024). A last section packs
the weight with batch-size hints None, 1, 2, 8 and records what the hint does to speed and invariance
(and ``torch.addmv``, MKL's 1-row matrix-vector product, for scale), and the fixed cost of one call
(a 16 -> 16 product of 1 row). Records the CPU, torch and
library versions.
"""

from __future__ import annotations

import argparse
import platform
import re
import statistics
import subprocess
import time
from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn import functional as F

from lightning_bpd.kernels import onednn
from lightning_bpd.records import write_json

SHAPES = ((256, 8000), (256, 1024), (1024, 256), (512, 58101), (512, 2048), (2048, 512))  # (in, out)
ROWS = (1, 2, 4, 8, 16, 32)
HINTS = (None, 1, 2, 8)
INVARIANCE_ROWS = 32
INVARIANCE_THREADS = (1, 2)
METHOD = ("ms: median ms per call, F.linear and PackedLinear alternated call by call after a warm-up. invariance: "
          "differs_for_rows lists the n in 2..32 for which 32 rows taken n at a time differ in any bit from the rows "
          "taken one at a time. hints: the raw oneDNN product (no padding) with the weight packed for each hint, "
          "alternated with F.linear, torch.addmv and PackedLinear; each has its own copy of the weight, so these "
          "timings stream more weight bytes between two calls of one kernel than the ms table does and run slower "
          "for weights near the cache's size (compare within the section only).")


def cpu_info() -> dict[str, str]:
    """The CPU's model name (lscpu, else /proc/cpuinfo), family / model / stepping, and its widest vector ISA."""
    info: dict[str, str] = {"machine": platform.machine()}
    try:
        out = subprocess.run(["lscpu"], check=False, capture_output=True, text=True, timeout=10).stdout
        m = re.search(r"^Model name:\s*(.+)$", out, re.MULTILINE)
        if m:
            info["model_name"] = m.group(1).strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            text = f.read().split("\n\n")[0]
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        info.setdefault("model_name", fields.get("model name", "unknown"))
        for key in ("vendor_id", "cpu family", "model", "stepping"):
            if key in fields:
                info[key.replace(" ", "_")] = fields[key]
        flags = set(fields.get("flags", "").split())
        info["vector_isa"] = next((f for f in ("amx_tile", "avx512f", "avx2", "avx") if f in flags), "none")
    except OSError:
        pass
    info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return info


def library_versions() -> dict[str, str]:
    """torch's version and the MKL / oneDNN versions it was built with."""
    config = torch.__config__.show()
    out = {"torch": torch.__version__}
    for key, pattern in (("mkl", r"Math Kernel Library Version ([^\s]+)"), ("onednn", r"MKL-DNN (v[^\s]+)")):
        m = re.search(pattern, config)
        out[key] = m.group(1) if m else "unknown"
    return out


def alternated_medians(fns: dict[str, Callable[[], Tensor]], budget_s: float, min_repeats: int = 15,
                       max_repeats: int = 400) -> dict[str, float]:
    """Median seconds per call of each function, calls alternated, after a warm-up; repeats fit ``budget_s``."""
    t0 = time.perf_counter()
    for _ in range(3):
        for fn in fns.values():
            fn()
    per_round = (time.perf_counter() - t0) / 3
    repeats = max(min_repeats, min(max_repeats, int(budget_s / max(per_round, 1e-9))))
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()} | {"repeats": repeats}


def variant_batch_sizes(product: Callable[[Tensor], Tensor], x: Tensor) -> list[int]:
    """Row counts n (2..rows of x) for which x's rows multiplied n at a time differ in any bit from
    x's rows multiplied one at a time. Empty: the product is batch-invariant for 1..rows."""
    rows = x.shape[0]
    alone = torch.cat([product(x[i : i + 1]) for i in range(rows)])  # (rows, out)
    return [n for n in range(2, rows + 1)
            if not torch.equal(torch.cat([product(x[s : s + n]) for s in range(0, rows, n)]), alone)]


def raw_packed(weight: Tensor, bias: Tensor, hint: int | None) -> Callable[[Tensor], Tensor]:
    """The oneDNN product with the weight packed for ``hint`` rows, without PackedLinear's padding
    (a hint of 1 is allowed here, to measure it)."""
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), hint)
    return lambda x: onednn.packed_product(x, packed, bias)


def fixed_cost_us(threads: int, budget_s: float, g: torch.Generator) -> dict[str, float]:
    """Microseconds per call of a 16 -> 16 product of 1 row: what each kernel costs besides the arithmetic."""
    torch.set_num_threads(threads)
    w, b, x = torch.randn(16, 16, generator=g), torch.randn(16, generator=g), torch.randn(1, 16, generator=g)
    lin = onednn.PackedLinear(w, b)
    med = alternated_medians({"f_linear": lambda: F.linear(x, w, b), "packed": lambda: lin(x)}, budget_s)
    return {k: v * 1e6 for k, v in med.items() if k != "repeats"}


def measure_shape(d_in: int, d_out: int, threads: int, budget_s: float, g: torch.Generator) -> dict:
    """Timings (``threads`` threads), invariance (1 and 2 threads) and the batch-size hint study for one shape."""
    w = torch.randn(d_out, d_in, generator=g)  # (out, in)
    b = torch.randn(d_out, generator=g)  # (out,)
    lin = onednn.PackedLinear(w, b)
    entry: dict = {"in": d_in, "out": d_out, "ms": {}, "invariance": {}, "hints": {}}

    torch.set_num_threads(threads)
    for rows in ROWS:
        x = torch.randn(rows, d_in, generator=g)  # (rows, in)
        med = alternated_medians({"f_linear": lambda x=x: F.linear(x, w, b), "packed": lambda x=x: lin(x)}, budget_s)
        entry["ms"][str(rows)] = {"f_linear": med["f_linear"] * 1e3, "packed": med["packed"] * 1e3,
                                  "repeats": med["repeats"]}
    ms = entry["ms"]
    entry["ratio_8_over_1"] = {k: ms["8"][k] / ms["1"][k] for k in ("f_linear", "packed")}
    entry["packed_speedup_over_f_linear"] = {r: ms[r]["f_linear"] / ms[r]["packed"] for r in ms}

    x = torch.randn(INVARIANCE_ROWS, d_in, generator=g)  # (32, in)
    kernels = {"f_linear": lambda z: F.linear(z, w, b), "packed": lin, "packed_unpadded": raw_packed(w, b, None)}
    for n_threads in INVARIANCE_THREADS:
        torch.set_num_threads(n_threads)
        found = {k: variant_batch_sizes(fn, x) for k, fn in kernels.items()}
        entry["invariance"][f"{n_threads}_threads"] = {
            k: {"invariant": not bad, "differs_for_rows": bad} for k, bad in found.items()}

    torch.set_num_threads(threads)
    hinted = {f"hint_{h}": raw_packed(w, b, h) for h in HINTS}
    for rows in (1, 8):
        xr = torch.randn(rows, d_in, generator=g)  # (rows, in)
        fns = {name: (lambda f=f, xr=xr: f(xr)) for name, f in hinted.items()}
        fns["f_linear"] = lambda xr=xr: F.linear(xr, w, b)
        if rows == 1:
            fns["addmv"] = lambda xr=xr: torch.addmv(b, w, xr[0])
            fns["packed_linear"] = lambda xr=xr: lin(xr)  # hint None, and padded to 2 rows if in > 1024
        med = alternated_medians(fns, budget_s)
        entry["hints"][f"ms_{rows}_rows"] = {k: v * 1e3 for k, v in med.items() if k != "repeats"}
    entry["hints"]["layouts"] = "None, 2 and 8 pack the same blocked layout (AB16b64a), 1 the plain one (ab)"
    entry["hints"]["invariant_1_thread"] = {name: not variant_batch_sizes(f, x[:16]) for name, f in hinted.items()}
    return entry


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/runtime/onednn_products.json", help="write the record here")
    p.add_argument("--threads", type=int, default=1, help="torch threads for the timings")
    p.add_argument("--budget", type=float, default=0.6, help="seconds of timed calls per (shape, rows) cell")
    p.add_argument("--note", default="", help="free text stored in the record (e.g. the machine's load)")
    args = p.parse_args(argv)
    if not onednn.available():
        raise SystemExit("oneDNN packed linear ops are not available in this torch build")
    before = torch.get_num_threads()
    record: dict = {"kind": "onednn_products", "note": args.note, "cpu": cpu_info(), "versions": library_versions(),
                    "threads": args.threads, "budget_s_per_cell": args.budget, "method": METHOD, "shapes": {}}
    g = torch.Generator().manual_seed(0)
    try:
        record["fixed_cost_us_16x16_1_row"] = fixed_cost_us(args.threads, 4 * args.budget, g)
        for d_in, d_out in SHAPES:
            name = f"{d_in}->{d_out}"
            entry = measure_shape(d_in, d_out, args.threads, args.budget, g)
            record["shapes"][name] = entry
            ms, inv = entry["ms"], entry["invariance"]["1_threads"]
            print(f"{name:>11}: 1 row F.linear {ms['1']['f_linear']:.3f} packed {ms['1']['packed']:.3f} ms | "
                  f"8 rows F.linear {ms['8']['f_linear']:.3f} packed {ms['8']['packed']:.3f} ms | invariant (1 thr) "
                  + " ".join(f"{k}={v['invariant']}" for k, v in inv.items()), flush=True)
    finally:
        torch.set_num_threads(before)
    write_json(args.out, record)
    print(f"wrote {args.out}")
    return record


if __name__ == "__main__":
    main()
