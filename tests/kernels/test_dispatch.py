"""Which implementation runs where; the Triton kernels compile for a GPU (sm_90) even without one; on a
GPU (tests marked `gpu`), the compiled kernels agree with the reference."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
from kernel_cases import assert_close, rollout
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from kernels import discounted_returns, gae, td_lambda_returns
from kernels._common import resolve_backend
from kernels.gae import _gae_kernel

REPO = Path(__file__).resolve().parents[2]
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def _kernel(x):  # stands for a kernel built without the interpreter
    return x


COMPILED = JITFunction(_kernel)
INTERPRETED = InterpretedFunction(_kernel)  # as a kernel is under TRITON_INTERPRET=1, in any session


@pytest.mark.needs_interpreter
def test_the_test_session_interprets_the_kernels():
    assert os.environ["TRITON_INTERPRET"] == "1" and not isinstance(_gae_kernel, JITFunction)


ROUTES = {
    "cpu-interpreted-auto": ("auto", CPU, INTERPRETED, "triton"),
    "cpu-compiled-auto": ("auto", CPU, COMPILED, "torch"),
    "cuda-auto": ("auto", CUDA, COMPILED, "triton"),
    "cuda-without-triton": ("auto", CUDA, None, "torch"),
    "cpu-without-triton": ("auto", CPU, None, "torch"),
    "cpu-torch": ("torch", CPU, INTERPRETED, "torch"),
    "cuda-torch": ("torch", CUDA, COMPILED, "torch"),
    "cuda-reference": ("reference", CUDA, COMPILED, "reference"),
    "cpu-interpreted-triton": ("triton", CPU, INTERPRETED, "triton"),
}


@pytest.mark.parametrize("backend, device, kernel, expected", ROUTES.values(), ids=ROUTES.keys())
def test_resolve_backend(backend, device, kernel, expected):
    assert resolve_backend(backend, device, kernel) == expected


def test_triton_where_it_cannot_run_is_a_clear_error():
    message = (
        "backend='triton' cannot run here: Triton needs a CUDA device, or TRITON_INTERPRET=1 set before"
        " triton is first imported to run its interpreter on the CPU; got cpu tensors."
        " Use backend='auto' or 'torch'."
    )
    with pytest.raises(RuntimeError, match=re.escape(message)):
        resolve_backend("triton", CPU, COMPILED)
    with pytest.raises(RuntimeError, match="backend='triton' cannot run here: Triton is not installed"):
        resolve_backend("triton", CUDA, None)


# Run without TRITON_INTERPRET: the CPU routes of a normal session, and compiling every kernel for an
# H100/H200 (sm_90) with Triton's bundled ptxas, which needs no GPU.
WITHOUT_INTERPRETER = r"""
import json, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels import gae
from kernels.gae import _gae_kernel
from kernels.returns import _returns_kernel

report = {}
x = torch.randn(6, 4)
flags = torch.rand(6, 4) < 0.3
auto = gae(x, x, x, flags, flags, gamma=0.9, lmbda=0.9)
reference = gae(x, x, x, flags, flags, gamma=0.9, lmbda=0.9, backend="reference")
report["auto_matches_reference"] = all(torch.allclose(a, b, atol=1e-5) for a, b in zip(auto, reference))
try:
    gae(x, x, x, flags, flags, gamma=0.9, lmbda=0.9, backend="triton")
except RuntimeError as error:
    report["triton_error"] = str(error)

def compile_sm90(kernel, pointers, constexprs, ones=False, num_warps=4):
    # pointers: type of each *_ptr argument; ones: specialise every integer argument to 1, as Triton does
    # at launch when T, N or a stride is 1; otherwise they are multiples of 16, as at most training sizes.
    signature, values = {}, dict(constexprs)
    names = [name for name in kernel.arg_names if name.endswith("_ptr")]
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = pointers[names.index(name)]
        elif name in ("gamma", "lmbda"):  # a float, or a pointer to one value per column
            signature[name] = "*fp32" if constexprs.get(name.upper() + "_PER_COLUMN") else "fp32"
        elif ones:
            signature[name], values[name] = "constexpr", 1
        else:
            signature[name] = "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
             if signature[name] in ("i32", *pointers)}
    source = ASTSource(kernel, signature, constexprs=values, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    ptx = compiled.asm["ptx"]
    return {"vector_loads": ptx.count("ld.global.v4"), "local": ptx.count(".local"),
            "shared": compiled.metadata.shared}

f32, b16, i1 = "*fp32", "*bf16", "*i1"
floats = {"GAMMA_PER_COLUMN": False, "LMBDA_PER_COLUMN": False}
report["gae_flat_unit_strides"] = compile_sm90(_gae_kernel, [f32, f32, f32, i1, i1, f32, f32],
    {**floats, "FLAT": True, "BLOCK": 64, "TILE": 32, "r_s2": 1, "v_s2": 1, "nv_s2": 1, "d_s2": 1, "m_s2": 1},
    num_warps=8)
report["gae_narrow_long_tile"] = compile_sm90(_gae_kernel, [f32, f32, f32, i1, i1, f32, f32],
    {**floats, "FLAT": True, "BLOCK": 32, "TILE": 64, "r_s2": 1, "v_s2": 1, "nv_s2": 1, "d_s2": 1, "m_s2": 1},
    num_warps=4)
report["gae_grid_bf16"] = compile_sm90(_gae_kernel, [b16, b16, b16, f32, i1, f32, f32],
    {**floats, "FLAT": False, "BLOCK": 128, "TILE": 16}, num_warps=4)
report["gae_all_ones"] = compile_sm90(_gae_kernel, [f32, f32, f32, i1, i1, f32, f32],
    {**floats, "FLAT": True, "BLOCK": 32, "TILE": 16}, ones=True, num_warps=2)
report["gae_per_column_gamma_lmbda"] = compile_sm90(_gae_kernel, [f32, f32, f32, i1, i1, f32, f32],
    {"GAMMA_PER_COLUMN": True, "LMBDA_PER_COLUMN": True, "FLAT": False, "BLOCK": 64, "TILE": 64},
    num_warps=8)
report["returns_flat_unit_strides"] = compile_sm90(_returns_kernel, [f32, f32, i1, i1, f32],
    {"BOOTSTRAP": True, "FLAT": True, "BLOCK": 64, "TILE": 32, "r_s2": 1, "nv_s2": 1, "d_s2": 1, "m_s2": 1},
    num_warps=8)
for bootstrap in (True, False):
    report[f"returns_bootstrap_{bootstrap}"] = compile_sm90(_returns_kernel, [b16, f32, i1, i1, f32],
        {"BOOTSTRAP": bootstrap, "FLAT": False, "BLOCK": 128, "TILE": 32}, num_warps=8)
    report[f"returns_all_ones_{bootstrap}"] = compile_sm90(_returns_kernel, [f32, f32, i1, i1, f32],
        {"BOOTSTRAP": bootstrap, "FLAT": True, "BLOCK": 32, "TILE": 16}, ones=True, num_warps=2)
print(json.dumps(report))
"""

PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.fixture(scope="module")
def without_interpreter():
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_INTERPRETER], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not PTXAS.exists(), reason="Triton's bundled ptxas is missing")
def test_without_interpreter_cpu_tensors_take_the_torch_path(without_interpreter):
    assert without_interpreter["auto_matches_reference"]
    assert without_interpreter["triton_error"].startswith("backend='triton' cannot run here: Triton needs a CUDA")


@pytest.mark.skipif(not PTXAS.exists(), reason="Triton's bundled ptxas is missing")
def test_kernels_compile_for_sm90_without_spills(without_interpreter):
    kernels = {name: stats for name, stats in without_interpreter.items() if isinstance(stats, dict)}
    assert len(kernels) == 10
    for name, stats in kernels.items():
        assert stats["local"] == 0, (name, stats)  # no register spills
        if "unit_strides" in name:
            # Contiguous columns, 4 per thread: 128-bit loads. (The scan of a tile's rows across warps
            # goes through shared memory, a few KiB.)
            assert stats["vector_loads"] > 0, (name, stats)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "shape",
    [(1, 1), (3, 7), (200, 5, 3), (128, 4096, 4, 1), (100, 1000, 3, 1)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_compiled_kernels_match_reference_on_cuda(shape, dtype):
    data = {name: x.cuda() for name, x in rollout(shape[0], shape[1:], dtype=dtype).items()}
    env_flags = {name: data[name][..., :1, :] if len(shape) == 4 else data[name] for name in ("done", "terminated")}
    for flags in (data, env_flags):
        args = (data["reward"], data["value"], data["next_value"], flags["done"], flags["terminated"])
        per_env = torch.linspace(0.9, 1.0, shape[1], device="cuda").view(shape[1], *(1,) * (len(shape) - 2))
        for gamma, lmbda in ((0.99, 0.95), (per_env, per_env.flip(0))):
            for got, want in zip(
                gae(*args, gamma=gamma, lmbda=lmbda),
                gae(*args, gamma=gamma, lmbda=lmbda, backend="reference"),
                strict=True,
            ):
                assert got.is_cuda
                assert_close(got, want)
        args = (data["reward"], data["next_value"], flags["done"], flags["terminated"])
        assert_close(
            td_lambda_returns(*args, gamma=0.99, lmbda=0.95),
            td_lambda_returns(*args, gamma=0.99, lmbda=0.95, backend="reference"),
        )
        assert_close(
            discounted_returns(data["reward"], flags["done"], gamma=0.99),
            discounted_returns(data["reward"], flags["done"], gamma=0.99, backend="reference"),
        )
