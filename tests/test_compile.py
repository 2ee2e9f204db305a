"""``torch.compile`` compiles vaccinated code exactly as python's (``cells/_dynamo.py``).

Every program below runs twice in a fresh process, ``python prog.py`` and
``python -m daifu prog.py``, and prints what TorchDynamo did: its counters
(frames converted, graphs, graph breaks, recompiles), the graphs' code, the
guards ``torch._dynamo.explain`` reports, the ``TORCH_LOGS=graph_breaks,
recompiles`` lines, the results.  Both runs must print the same.  Without
``cells._dynamo`` a vaccinated function with a graph break ran entirely
eagerly (every instruction sits in a cell's handler range: Dynamo's ``try``
block) and ``fullgraph=True`` failed on a handled exception.

Then a crash raised inside compiled code -- by a graph at run time, and by a
function Dynamo runs eagerly between two graphs -- is taken at the training
loop's call of the compiled model, fixed by a rule, and the retry runs the
compiled call again: the result is the corrected program's, compiled too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import types
import warnings
from pathlib import Path

import pytest

from daifu.cells import _dynamo

from .support import read_events, vaccinate

REPORT = '''
import json
import torch._dynamo as dyn

def report(**extra):
    counters = {k: dict(v) for k, v in dyn.utils.counters.items() if v}
    print("RESULT " + json.dumps({"counters": counters, **extra}, sort_keys=True, default=str))
'''

#: name -> (source, argv): each a program compiled with ``torch.compile``
PROGRAMS = {
    # a data-dependent branch and a print: two graph breaks, six graphs
    "graph_breaks": ('''
        import torch
        from _report import report

        graphs = []
        def backend(gm, example_inputs):
            graphs.append(gm.code)
            return gm.forward

        def f(x):
            h = x * 2
            if h.sum() > 0:          # a data-dependent branch: a graph break
                return h.relu()
            return h.tanh()

        def g(x):
            y = x + 1
            print("an eager print")  # a graph break
            return y * y

        cf, cg = torch.compile(f, backend=backend), torch.compile(g, backend=backend)
        out = [cf(torch.ones(3)), cf(-torch.ones(3)), cg(torch.ones(3))]
        report(graphs=graphs, out=[t.tolist() for t in out])
    ''', []),
    # one graph: a helper with a loop inlined, a handled KeyError traced; a
    # graph break under fullgraph=True is an error
    "fullgraph": ('''
        import torch
        from _report import report

        graphs = []
        def backend(gm, example_inputs):
            graphs.append(gm.code)
            return gm.forward

        def helper(x, k):
            for _ in range(k):
                x = torch.sin(x) + x
            return x

        def lookup(table, key):
            try:
                return table[key]
            except KeyError:
                return 1.0

        def f(x, k: int = 3):
            y = helper(x, k) * lookup({"a": 2.0}, "b")
            try:
                z = y.cos()
            except ValueError:
                z = y
            return z.sum()

        def h(x):
            y = x + 1
            torch._dynamo.graph_break()
            return y

        out = torch.compile(f, backend=backend, fullgraph=True)(torch.arange(4.0))
        try:
            torch.compile(h, backend=backend, fullgraph=True)(torch.ones(2))
            error = None
        except Exception as exc:
            error = type(exc).__name__
        report(graphs=graphs, out=out.item(), error=error)
    ''', []),
    # torch.compile(model): the vaccinated forwards are inlined; a .item() in
    # each block's forward is a graph break; trained three steps
    "module": ('''
        import torch
        import torch.nn as nn
        from _report import report

        graphs = []
        def backend(gm, example_inputs):
            graphs.append(gm.code)
            return gm.forward

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(8, 8)

            def forward(self, x):
                h = self.lin(x)
                if h.mean().item() > 10:   # a graph break (.item(), data-dependent)
                    h = h * 0
                return torch.relu(h) + x

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = nn.ModuleList([Block(), Block()])
                self.head = nn.Linear(8, 2)

            def forward(self, x):
                for block in self.blocks:
                    x = block(x)
                return self.head(x)

        def train(steps):
            torch.manual_seed(0)
            net = Net()
            model = torch.compile(net, backend=backend)
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            for _ in range(steps):
                loss = model(torch.randn(4, 8)).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            return loss.item()

        report(graphs=graphs, loss=train(3))
    ''', []),
    # guards and recompiles: new shapes (then dynamic), a new int, a float
    "recompiles": ('''
        import torch
        from _report import report

        def f(x, scale):
            return (x * scale).sum(0)

        cf = torch.compile(f, backend="eager")
        outs = []
        for shape, scale in [((3,), 2), ((3,), 2), ((5,), 2), ((7, 2), 2), ((3,), 3),
                             ((3,), 2.5)]:
            outs.append(cf(torch.ones(shape), scale).tolist())
        report(out=outs)
    ''', []),
    # torch._dynamo.explain: graphs, break reasons, guards (source, kind)
    "explain": ('''
        import torch
        from _report import report

        def f(x):
            x = x.sin()
            torch._dynamo.graph_break()
            x = x.cos()
            if x.sum() > 0:
                x = x + 1
            print("eager")
            return x.exp()

        e = torch._dynamo.explain(f)(torch.randn(5))
        guards = sorted({(g.name, g.create_fn_name()) for g in e.out_guards})
        report(graph_count=e.graph_count, graph_break_count=e.graph_break_count,
               op_count=e.op_count, reasons=[r.reason for r in e.break_reasons], guards=guards)
    ''', []),
    # inductor on CPU, default mode and max-autotune-no-cudagraphs, a graph break each
    "inductor": ('''
        import torch
        from _report import report

        def f(x, w):
            h = torch.tanh(x @ w)
            if h.sum() > 0:          # a graph break
                h = h * 2
            return h.softmax(-1)

        def g(x, w):
            return f(x, w) + 1

        torch.manual_seed(0)
        x, w = torch.randn(4, 8), torch.randn(8, 8)
        default = torch.compile(f)
        autotuned = torch.compile(g, mode="max-autotune-no-cudagraphs")
        a, b = default(x, w), autotuned(x, w)
        report(out=[a.tolist(), b.tolist()], again=[torch.equal(default(x, w), a),
                                                    torch.equal(autotuned(x, w), b)])
    ''', []),
}

#: the TORCH_LOGS lines compared (each without its time, pid and source line)
_LOG_LINE = re.compile(r"^[VIWE]\d{4} [\d:.]+ +\d+ [^\]]*\] (.*)$")
#: an object's id in a guard (a type's, a module's): another in each process
_ADDRESS = re.compile(r"\b(\d{9,}|0x[0-9a-f]{6,})\b")


def _env(tmp_path: Path, **extra: str) -> dict:
    # inductor compiles each graph in both runs (no FX graph or AOTAutograd
    # cache: its counters are what it did), and C++ only once: the second
    # run finds each kernel's source in the kernel cache they share
    env = dict(os.environ, DAIFU_CONSOLE="0", DAIFU_CACHE="0", PYTHONHASHSEED="0",
               OMP_NUM_THREADS="1", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
               TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0", **extra)
    env.pop("DAIFU_MODULES", None)
    return env


def _start(cwd: Path, argv: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, env=env)


def _finish(proc: subprocess.Popen) -> tuple[str, str]:
    """(stdout, stderr) of a run that must succeed."""
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-4000:]
    return out, err


def _result(proc: subprocess.Popen) -> tuple[dict, list[str]]:
    """The program's RESULT and its TORCH_LOGS lines."""
    out, err = _finish(proc)
    results = [line[len("RESULT "):] for line in out.splitlines() if line.startswith("RESULT ")]
    assert len(results) == 1, out[-2000:]
    logs = [_ADDRESS.sub("ID", m.group(1)) for m in map(_LOG_LINE.match, err.splitlines()) if m]
    return json.loads(results[0]), logs


def _kernels(tmp_path: Path) -> set[Path]:
    """The C++ kernels inductor compiled (one shared library per source)."""
    return set((tmp_path / "inductor").rglob("*.so"))


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("name", ["graph_breaks", "fullgraph", "module", "recompiles", "explain",
                                  "inductor"])
def test_dynamo_compiles_vaccinated_code_as_python_does(name, tmp_path):
    pytest.importorskip("torch", reason="PyTorch not available (not installed for this "
                                        "Python): nothing is compiled")
    source, args = PROGRAMS[name]
    (tmp_path / "_report.py").write_text(REPORT)
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    env = _env(tmp_path, TORCH_LOGS="graph_breaks,recompiles")
    plain_run = [sys.executable, f"{name}.py", *args]
    daifu_run = [sys.executable, "-m", "daifu", f"{name}.py", *args]
    if name == "inductor":  # one after the other: the second finds the first's kernels
        plain, plain_logs = _result(_start(tmp_path, plain_run, env))
        kernels = _kernels(tmp_path)
        vacc, vacc_logs = _result(_start(tmp_path, daifu_run, env))
    else:  # side by side (two cores)
        procs = [_start(tmp_path, plain_run, env), _start(tmp_path, daifu_run, env)]
        if name in ("graph_breaks", "module"):  # first-call stubs: inlined, called at a break
            procs.append(_start(tmp_path, [*daifu_run[:3], "--lazy", *daifu_run[3:]], env))
        (plain, plain_logs), (vacc, vacc_logs), *lazy = map(_result, procs)
        assert lazy in ([], [(plain, plain_logs)])
        kernels = _kernels(tmp_path)
    assert vacc == plain
    assert vacc_logs == plain_logs
    # the second run compiled no kernel the first did not: the same C++ sources
    assert _kernels(tmp_path) == kernels
    if name == "inductor":
        assert kernels

    if name in ("graph_breaks", "module", "explain"):  # (what failed before)
        assert plain["counters"]["stats"]["unique_graphs"] >= 2
    if name == "recompiles":
        assert any("Recompiling function f" in line for line in plain_logs)


CRASHING = '''
import os
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch._dynamo as dyn

LOGDIR = os.path.join(os.getcwd(), "stats")
# FIXED (the corrected program): os.makedirs(LOGDIR)


@torch.compiler.disable
def record(h):
    """Statistics, written eagerly between the two graphs of the forward."""
    with open(os.path.join(LOGDIR, "mean.txt"), "a") as fh:
        fh.write(f"{h.abs().mean().item():.6f}\\n")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, idx):
        h = self.emb(idx)              # graph 1: a bad id raises here, at run time
        record(h)                      # run eagerly: a graph break
        if h.abs().sum() > 1e6:        # data-dependent: a graph break
            h = h / 2
        return self.head(h).mean(1)    # graph 2


def batches():
    g = torch.Generator().manual_seed(1)
    for step in range(6):
        idx = torch.randint(0, 16, (4, 5), generator=g)
        if step == 2:
            idx[1, 3] = 16  # FIXED: 15
        yield idx, torch.randint(0, 4, (4,), generator=g)


def train():
    torch.manual_seed(0)
    net = Net()
    model = torch.compile(net, backend="aot_eager")
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for idx, y in batches():
        out = model(idx)
        loss = F.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with open(os.path.join(LOGDIR, "mean.txt")) as fh:
        means = fh.read().split()
    counters = {k: dict(v) for k, v in dyn.utils.counters.items()
                if k in ("frames", "stats") and v}
    return [p.tolist() for p in net.parameters()], means, counters


print("RESULT", train())
'''

FIXES = '''
import os
import daifu


@daifu.on(FileNotFoundError, where="train")
def make_logdir(crash):
    os.makedirs(crash.globals["LOGDIR"])
    return daifu.RETRY


@daifu.on(IndexError, where="train")
def clean_ids(crash):
    if "index out of range" not in str(crash.exception):
        return None
    crash.exec("idx = idx.clamp(max=15)")
    return daifu.RETRY
'''


@pytest.mark.torch
@pytest.mark.slow
def test_a_crash_inside_compiled_code_is_taken_fixed_and_the_compiled_call_retried(tmp_path):
    pytest.importorskip("torch", reason="PyTorch not available (not installed for this "
                                        "Python): nothing is compiled")
    corrected = CRASHING.replace("# FIXED (the corrected program): ", "").replace(
        "idx[1, 3] = 16  # FIXED: 15", "idx[1, 3] = 15")
    for name, text in (("buggy", CRASHING), ("corrected", corrected)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "prog.py").write_text(text)
    (tmp_path / "buggy" / "fixes.py").write_text(FIXES)
    env = _env(tmp_path)
    log = tmp_path / "events.jsonl"
    ref = _start(tmp_path / "corrected", [sys.executable, "prog.py"], env)
    live = _start(tmp_path / "buggy", [sys.executable, "-m", "daifu", "--log", str(log),
                                       "--fixes", "fixes.py", "prog.py"], env)
    ref_out, live_out = _finish(ref)[0], _finish(live)[0]
    result = [line for line in live_out.splitlines() if line.startswith("RESULT")]
    assert result and result == [line for line in ref_out.splitlines()
                                 if line.startswith("RESULT")]
    events = read_events(log)
    taken = [e["exc_type"] for e in events if e["event"] == "crash.intercepted"]
    assert taken == ["FileNotFoundError", "IndexError"]
    # both were fixed at the training loop's call of the compiled model, and
    # the retries ran that call again: the FileNotFoundError was taken first
    # where it was raised, in the function Dynamo ran eagerly, and handed up
    call = 1 + CRASHING.splitlines().index("        out = model(idx)")
    resumed = [e for e in events if e["event"] == "crash.resumed"]
    assert [(e["where"], e["action"]) for e in resumed] == [
        (f"{tmp_path / 'buggy' / 'prog.py'}:{call}", "retry")] * 2
    assert [[w.rpartition(" ")[2] for w in e["passed_through"]] for e in resumed] == [
        ["(record)"], []]


def test_dynamo_traces_the_original_of_vaccinated_code_only():
    ns = vaccinate('''
        def f(x, *args, k=1, **kw):
            y = x + k
            return y
    ''')
    code = ns["f"].__code__
    original = _dynamo.traced_code(code, frame=True)
    module = compile("def f(x, *args, k=1, **kw):\n    y = x + k\n    return y\n", "f", "exec")
    plain = next(c for c in module.co_consts if isinstance(c, types.CodeType))
    assert original is not code and code.co_exceptiontable  # (the cells' ranges)
    assert original.co_code == plain.co_code and not original.co_exceptiontable
    assert _dynamo.traced_code(original) is original  # plain code: itself
    assert _dynamo.traced_code("not code") == "not code"
    # another layout of locals: Dynamo's C code would copy the frame's wrongly
    other = code.replace(co_varnames=(*code.co_varnames[:-1], "z"))
    assert _dynamo.traced_code(other, frame=True) is other


@pytest.fixture
def fresh_patch(monkeypatch):
    """``trace_original`` with nothing patched yet, and fake Dynamo modules."""
    monkeypatch.setattr(_dynamo, "_state", type(_dynamo._state)())  # (its own: nothing patched)
    convert, symbolic = types.ModuleType("convert_frame"), types.ModuleType("symbolic_convert")
    monkeypatch.setitem(sys.modules, "torch._dynamo.convert_frame", convert)
    monkeypatch.setitem(sys.modules, "torch._dynamo.symbolic_convert", symbolic)
    return convert, symbolic


def test_the_patch_wraps_dynamo_where_it_reads_code(fresh_patch):
    convert, symbolic = fresh_patch
    seen = []

    def compile_frame(code, globals, locals, *rest, **kw):
        seen.append(code)
        return "bytecode"

    class InliningInstructionTranslator:
        def __init__(self, parent, code, symbolic_locals):
            seen.append(code)

    convert.compile_frame = compile_frame
    symbolic.InliningInstructionTranslator = InliningInstructionTranslator
    init = InliningInstructionTranslator.__init__
    ns = vaccinate("def f(x):\n    y = x + 1\n    return y\n")
    code = ns["f"].__code__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _dynamo.trace_original()
    assert convert.compile_frame(code, {}, {}, one_graph=True) == "bytecode"
    InliningInstructionTranslator(None, code, {})
    assert seen == [_dynamo.traced_code(code)] * 2 and seen[0] is not code
    assert _dynamo.trace_original()  # (once)
    _dynamo.restore()
    assert convert.compile_frame is compile_frame
    assert InliningInstructionTranslator.__init__ is init


def test_another_dynamo_is_left_alone_with_a_warning(fresh_patch):
    convert, symbolic = fresh_patch

    def compile_frame(frame, *args):  # (not the signature daifu knows)
        return "bytecode"

    convert.compile_frame = compile_frame
    symbolic.InliningInstructionTranslator = type("InliningInstructionTranslator", (), {})
    with pytest.warns(Warning, match="TorchDynamo is not the one daifu knows"):
        assert not _dynamo.trace_original()
    assert convert.compile_frame is compile_frame
