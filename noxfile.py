"""Sessions: ``tests``, ``lint``, ``demo``, ``bench``.

Every session runs in ONE shared virtual environment (``.nox/shared``, or ``$SHARDCORE_NOX_ENV``)
so a fresh machine builds the heavy PyTorch environment once per run, not once per session.
Third-party requirements are installed when the environment is created or when a
``pyproject.toml`` or this file changes (a stamp records their hash); shardcore and the plugins
themselves are re-installed from this checkout, as wheels, at the start of every session.

    nox -s tests                        # the whole suite (core + every plugin)
    nox -s tests -- plugins/shard-llama # one package's tests
    nox -s isolated                     # each plugin installed alone with the core, its tests
    nox -s demo                         # Llama sharded over 2 CPU processes vs unsharded
    nox -s bench                        # shardcore TP vs PyTorch TP vs unsharded
    nox -s memory                       # loading a checkpoint: RSS and time vs HuggingFace
    nox -s bench-parallelize            # shardcore.parallelize start-up and RSS vs one unsharded process
    nox -s bench-kernels                # the optimization switches on/off at TP=2 (step-time ratios)
    nox -s bench-consistency            # the cost of the rank-consistency guards at TP=2
    nox -s bench-overlap                # can a gloo collective progress beside a matmul here
    nox -s bench-sequence               # sequence parallelism at 1024-4096 tokens (2 ranks), ring vs all-gather at 2048-8192 (4)
    nox -s long-sequence                # 32768 tokens: one process out of memory under a cap, SP=4 ring_attn trains under it
    nox -s bench-moe                    # a small Mixtral unsharded, TP=2, EP=2: step, memory, all-to-alls vs explain
    nox -s bench-auto                   # every layout of 4 ranks, 3 models x 2 lengths: explain --auto's prediction vs the clock
    nox -s bench-param-repr             # plain local shards vs DTensor parameters (prototype) at TP=2: the step's parts
    nox -s bench-gpu                    # Llama-3-8B layers on the GPUs at hand: tokens/s, MFU, memory vs PyTorch TP, HF tp_plan
    nox -s convergence                  # BERT fine-tuning unsharded vs TP=2 vs TP=4
    nox -s mutants                      # mutation testing: each deliberate bug caught by its declared check
    nox -s parity                       # the parity tests under the portable and the AVX2 CPU kernels
    nox -s margins                      # docs/margins.md: the kit's comparisons closest to their tolerance
    nox -s compat                       # each plugin under the oldest and the newest transformers/timm
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import sys

import nox

ROOT = pathlib.Path(__file__).resolve().parent
# every plugin directory with a pyproject.toml; ``plugins/_template`` (and any ``_``-prefixed one) is not a plugin
PLUGINS = sorted(
    p for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").is_file() and not p.name.startswith("_")
)
ENV = pathlib.Path(os.environ.get("SHARDCORE_NOX_ENV", ROOT / ".nox" / "shared"))

# PyTorch pins served from local disk on our machines (the core needs torch 2.13+): the CPU build, or,
# for environments with timm (which needs torchvision), the matching torch + torchvision pair.
TORCH = os.environ.get("SHARDCORE_TORCH", "torch==2.13.0")
TORCH_VISION = os.environ.get("SHARDCORE_TORCH_VISION", "torch==2.14.1 torchvision==0.29.1")
NEEDS_TORCHVISION = {"shard-vit"}
TOOLS = ["pytest>=8", "ruff>=0.6", "hatchling>=1.21", "hatch-fancy-pypi-readme>=24", "tqdm"]

nox.options.sessions = ["lint", "tests"]
nox.options.default_venv_backend = "none"


def _bin(env: pathlib.Path) -> pathlib.Path:
    return env / ("Scripts" if os.name == "nt" else "bin")


#: a plugin installed with another extra than ``test`` (``compat -- "shard-vit[hf]"``: its HF branch alone)
EXTRAS: dict[str, str] = {}


def _torch(plugins: list[pathlib.Path]) -> list[str]:
    vision = any(p.name in NEEDS_TORCHVISION and EXTRAS.get(p.name, "test") != "hf" for p in plugins)
    return (TORCH_VISION if vision else TORCH).split()


def _stamp(plugins: list[pathlib.Path], pins: tuple[str, ...] = ()) -> str:
    files = [ROOT / "noxfile.py", ROOT / "pyproject.toml", *(p / "pyproject.toml" for p in plugins)]
    extras = [f"{p.name}[{EXTRAS.get(p.name, 'test')}]" for p in plugins]
    digest = hashlib.sha256(" ".join([*_torch(plugins), *pins, *extras]).encode())
    for f in files:
        digest.update(f.read_bytes())
    return digest.hexdigest()


def _install(
    session: nox.Session,
    env: pathlib.Path = ENV,
    plugins: list[pathlib.Path] = PLUGINS,
    pins: tuple[str, ...] = (),
    extras: str = "test",
) -> pathlib.Path:
    """Create (or reuse) ``env`` with the core and ``plugins`` (with their ``test`` extras) and the
    third-party ``pins`` (``"transformers==4.51.3"``), the core with its ``extras``; return its bin dir.

    The environment is built from scratch only when it is missing or its PyTorch pin changed
    (``.shardcore-torch``); when a pyproject or this file changed (``.shardcore-stamp``), the
    third-party requirements are installed into it incrementally, so adding a plugin does not
    rebuild PyTorch. This checkout's packages are re-installed as wheels whenever their sources differ from
    what the environment holds (:func:`_sources`).
    """
    stamp, torch_stamp, bin_dir = env / ".shardcore-stamp", env / ".shardcore-torch", _bin(env)
    pip = [str(bin_dir / "python"), "-m", "pip", "install", "--quiet"]
    packages = [f"{ROOT}[{extras}]", *(f"{p}[{EXTRAS.get(p.name, 'test')}]" for p in plugins)]
    torch_spec = " ".join(_torch(plugins))
    if not torch_stamp.is_file() or torch_stamp.read_text() != torch_spec:
        if env.exists():
            shutil.rmtree(env)
        session.run(sys.executable, "-m", "venv", str(env), external=True)
        session.run(*pip, *_torch(plugins), external=True)
        torch_stamp.write_text(torch_spec)
    if not stamp.is_file() or stamp.read_text() != _stamp(plugins, (*pins, extras)):
        session.run(*pip, *_torch(plugins), *TOOLS, *packages, *pins, external=True)
        stamp.write_text(_stamp(plugins, (*pins, extras)))
    sources, installed = env / ".shardcore-sources", _sources([ROOT, *plugins])
    if not sources.is_file() or sources.read_text() != installed:  # (CI's later sessions: the same checkout)
        session.run(
            *pip, "--no-deps", "--no-build-isolation", "--force-reinstall", str(ROOT), *map(str, plugins), external=True
        )
        sources.write_text(installed)
    return bin_dir


def _sources(packages: list[pathlib.Path]) -> str:
    """A digest of what the wheels of ``packages`` are built from (every file of each package's own source tree
    and its pyproject, README and LICENSE; tests left out): equal digests, equal wheels."""
    digest = hashlib.sha256()
    for package in packages:
        top = [package / name for name in ("pyproject.toml", "README.md", "LICENSE")]
        code = [f for d in package.iterdir() if d.is_dir() and (d / "__init__.py").is_file() for f in d.rglob("*")]
        for f in sorted(f for f in [*top, *code] if f.is_file() and "__pycache__" not in f.parts):
            digest.update(f.relative_to(ROOT).as_posix().encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()


def _run(session: nox.Session, bin_dir: pathlib.Path, tool: str, *args: str, **env: str) -> None:
    session.run(str(bin_dir / tool), *args, external=True, env={"PYTHONHASHSEED": "0", **env})


def _bench(session: nox.Session, bin_dir: pathlib.Path, name: str, script: str, repeats: int | None = None) -> None:
    """A benchmark run ``$BENCH_REPEATS`` times (3; ``repeats`` for a benchmark that repeats inside
    itself) by ``benchmarks/repeat.py``: every run and the median with min-max of each figure in
    ``benchmarks/results/NAME.json`` (committed)."""
    _run(
        session,
        bin_dir,
        "python",
        "benchmarks/repeat.py",
        "--name",
        name,
        *(["--repeats", os.environ.get("BENCH_REPEATS", str(repeats))] if repeats else []),
        "--",
        str(bin_dir / "python"),
        script,
        *session.posargs,
    )


#: where the kit's comparisons record their margins during ``tests`` and ``tests-slow`` (``nox -s margins``)
MARGINS = ROOT / ".nox" / "margins.jsonl"


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite on real multi-process gloo groups (CPU), all but the tests marked slow (``tests-slow``);
    the kit's comparisons closest to their tolerance are listed at the end (``nox -s margins``)."""
    bin_dir = _install(session)
    # the slowest tests in every log, so the suite's time budget (8 min) is watched
    paths = session.posargs or [
        "--durations=25",
        "-m",
        "not slow and not engine",
        "tests",
        *(str(p / "tests") for p in PLUGINS),
    ]
    MARGINS.unlink(missing_ok=True)  # this run's margins; tests-slow adds its own
    _run(session, bin_dir, "pytest", *paths, SHARDCORE_MARGINS=str(MARGINS))


@nox.session(name="tests-slow")
def tests_slow(session: nox.Session) -> None:
    """The tests marked ``slow`` (8-rank layouts, scripts in fresh processes, machine calibration) and those
    ``tests/slow_tests.txt`` lists by their measured time: the rest of the suite, kept out of ``nox -s tests``;
    CI runs one part of them in its turn (``-- --part K/N``)."""
    bin_dir = _install(session)
    # ``-- --part K/N``: one of N parts, whole files dealt round (CI runs one part in its turn: .ci/run)
    paths = [
        "--durations=10",
        "-m",
        "slow and not engine",
        "tests",
        *(str(p / "tests") for p in PLUGINS),
        *session.posargs,
    ]
    _run(session, bin_dir, "pytest", *paths, SHARDCORE_MARGINS=str(MARGINS))


#: the parity tests ``nox -s parity`` runs under other CPU kernels: the kit against known-wrong models, and
#: each kind of comparison (outputs, losses, gradients, steps, save_pretrained, generate) on the families
#: whose numbers reach furthest (CLIP's logit_scale, ViT's kernels, Llama, BERT)
PARITY = [
    "tests/test_core_kit_selftest.py",
    "tests/test_core_toy.py",
    "plugins/shard-clip/tests/test_clip_tp.py",
    # the flash and norm switches (kernels against the plain math, and sharded against unsharded); the jit
    # switch left out: torch 2.14's inductor emits at::vec code it does not declare under
    # ATEN_CPU_CAPABILITY=default with one thread (a C++ compile error), so shardcore runs unfused, as it
    # says, and the test's "modules compiled" cannot hold
    *(
        f"plugins/shard-vit/tests/test_vit_kernels.py::test_optimization_flags_at_tp2[{lib}-{flag}]"
        for lib in ("hf", "timm")
        for flag in ("flash", "norm")
    ),
]  # (T5's and the MoE's TP tests left it for CI's 30 minutes: the suite runs them under the machine's kernels)
#: the families' TP suites under the other kernels too: ``nox -s parity -- families`` (CI's turn of the day;
#: left out of CI's daily parity for its 30 minutes, about a minute)
PARITY_FAMILIES = ["plugins/shard-llama/tests/test_llama_tp.py", "plugins/shard-bert/tests/test_bert_tp.py"]
#: what ``nox -s parity`` runs them under: PyTorch's portable kernels and AVX2's (ATen's own names), each
#: but the machine's own (``torch.backends.cpu.get_cpu_capability()``), which ran the whole suite in
#: ``nox -s tests``
CAPABILITIES = ("default", "avx2")


@nox.session
def parity(session: nox.Session) -> None:
    """The parity tests (:data:`PARITY`) under other CPU kernels (``ATEN_CPU_CAPABILITY``, each of
    :data:`CAPABILITIES`, or those given: ``nox -s parity -- default``): a tolerance that holds for one
    instruction set only fails here, not on the next machine. ``-- families``: :data:`PARITY_FAMILIES` instead."""
    bin_dir = _install(session)
    families = "families" in session.posargs
    tests, given = (PARITY_FAMILIES if families else PARITY), [a for a in session.posargs if a != "families"]
    own = session.run(
        str(bin_dir / "python"), "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())", silent=True
    )
    own = (own or "").strip().splitlines()[-1].lower() if own else ""
    # the machine's own kernels ran the whole suite (nox -s tests): the others, not that one again
    for capability in given or [c for c in CAPABILITIES if c != own]:
        session.log(f"ATEN_CPU_CAPABILITY={capability}")
        margins = ROOT / ".nox" / f"margins-{capability}.jsonl"  # the closest comparisons listed at the end
        margins.unlink(missing_ok=True)
        _run(session, bin_dir, "pytest", "-q", *tests, ATEN_CPU_CAPABILITY=capability, SHARDCORE_MARGINS=str(margins))


@nox.session(default=False)
def margins(session: nox.Session) -> None:
    """Write ``docs/margins.md`` from the margins ``nox -s tests`` and ``tests-slow`` recorded: the kit's
    comparisons whose worst error came above 0.3 of their tolerance (:mod:`shardcore.testing.tolerance`)."""
    bin_dir = _install(session)
    _run(session, bin_dir, "python", "tests/margins.py", str(MARGINS), "docs/margins.md")


def _parts(plugin: pathlib.Path) -> list[pathlib.Path]:
    """The sibling plugins a composite plugin's ``parts`` extra names (shard-llava: shard-clip, shard-llama):
    installed beside it, as its users install them."""
    import tomllib

    extras = tomllib.loads((plugin / "pyproject.toml").read_text())["project"].get("optional-dependencies", {})
    return [ROOT / "plugins" / name for name in extras.get("parts", [])]


@nox.session
@nox.parametrize("plugin", [p.name for p in PLUGINS])
def isolated(session: nox.Session, plugin: str) -> None:
    """One plugin installed alone beside the core (no other plugin but the parts a composite plugin
    delegates to): its own tests pass."""
    path = ROOT / "plugins" / plugin
    bin_dir = _install(session, ROOT / ".nox" / f"isolated-{plugin}", [path, *_parts(path)])
    _run(session, bin_dir, "pytest", str(path / "tests"), *session.posargs)


#: the training engines with a recipe and a test of their own (``tests/engines/test_<name>.py``), each the core's extra
ENGINES = {
    "lightning": ("transformers",),
    "metrics": (),
    "ray": ("transformers",),
    "accelerate": ("transformers",),
}  # {the extra: what else its tests install}


@nox.session(default=False)
@nox.parametrize("name", list(ENGINES))
def engine(session: nox.Session, name: str) -> None:
    """An engine's recipe (Lightning, Ray Train, accelerate) or the metrics' sinks (TensorBoard, W&B offline)
    tested from a fresh environment that installs the core with only that extra (and transformers, the examples' models, for
    Lightning, Ray and accelerate; no plugin): ``tests/engines/test_<name>.py``."""
    bin_dir = _install(session, ROOT / ".nox" / f"engine-{name}", [], ENGINES[name], extras=f"test,{name}")
    _run(
        session,
        bin_dir,
        "pytest",
        "-m",
        "engine",
        f"tests/engines/test_{name}.py",
        *session.posargs,
        WANDB_SILENT="true",
    )


#: The oldest releases the plugins declare and are tested with (``nox -s compat``).
OLDEST = ("transformers==4.51.3", "timm==1.0.23")


@nox.session(default=False)
@nox.parametrize("leg", ["oldest", "newest"])
def compat(session: nox.Session, leg: str) -> None:
    """Each plugin's parity suite under the oldest supported transformers and timm, or the newest.

    ``nox -s compat -- shard-bert shard-llama`` limits it to those plugins; ``"shard-vit[hf]"``
    installs shard-vit with its ``hf`` extra alone (no timm, so no torchvision: the plain CPU
    environment) and deselects its timm tests (``-k "not timm"``). The newest leg uses
    the shared environment (the newest releases the registries hold when it was built); the
    oldest one ``.nox/compat-oldest``, or ``.nox/compat-oldest-cpu`` without shard-vit (the
    plain CPU build of PyTorch: no torchvision needed).
    """
    names = {a.removesuffix("[hf]"): a.endswith("[hf]") for a in session.posargs}
    chosen = [p for p in PLUGINS if not names or p.name in names]
    EXTRAS.clear()  # this session's choice alone (another session in the same nox call chose its own)
    EXTRAS.update({name: "hf" for name, hf in names.items() if hf})
    deselect = ["-k", "not timm"] if any(names.values()) else []  # "[hf]": the timm tests are deselected
    if leg == "newest":
        bin_dir = _install(session)
    else:
        vision = any(p.name in NEEDS_TORCHVISION and p.name not in EXTRAS for p in chosen)
        pins = OLDEST if vision else tuple(p for p in OLDEST if not p.startswith("timm"))  # timm needs torchvision
        bin_dir = _install(session, ROOT / ".nox" / ("compat-oldest" if vision else "compat-oldest-cpu"), chosen, pins)
    session.run(
        str(bin_dir / "python"), "-c", "import transformers, sys; print('transformers', transformers.__version__)"
    )
    _run(session, bin_dir, "pytest", *deselect, *(str(p / "tests") for p in chosen))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and format check."""
    bin_dir = _install(session)
    _run(session, bin_dir, "ruff", "check", ".")
    _run(session, bin_dir, "ruff", "format", "--check", ".")


#: The documentation site's tools, pinned (a light environment of its own: no PyTorch; the API
#: pages are read from the source by griffe, nothing is imported).
DOCS = ("mkdocs==1.6.1", "mkdocs-material==9.8.1", "mkdocstrings==1.0.8", "mkdocstrings-python==2.0.11")


@nox.session(python=False)
def docs(session: nox.Session) -> None:
    """The documentation site (MkDocs, ``--strict``: a broken link or a docstring griffe cannot read
    fails it) built into ``site/``; ``nox -s docs -- serve`` serves it while you edit."""
    env = ROOT / ".nox" / "docs-env"
    stamp = env / ".shardcore-docs"
    if not stamp.is_file() or stamp.read_text() != " ".join(DOCS):
        session.run(sys.executable, "-m", "venv", str(env), external=True)
        session.run(str(_bin(env) / "python"), "-m", "pip", "install", "--quiet", *DOCS, external=True)
        stamp.write_text(" ".join(DOCS))
    if session.posargs[:1] == ["serve"]:
        session.run(str(_bin(env) / "mkdocs"), "serve", external=True)
    else:
        session.run(str(_bin(env) / "mkdocs"), "build", "--strict", "--site-dir", "site", external=True)


@nox.session
def demo(session: nox.Session) -> None:
    """A small Llama trained a few steps sharded over 2 CPU processes beside the unsharded model."""
    bin_dir = _install(session)
    _run(
        session,
        bin_dir,
        "torchrun",
        "--standalone",
        "--nproc_per_node",
        "2",
        "examples/llama_tp_demo.py",
        *session.posargs,
        OMP_NUM_THREADS="1",
    )


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmark (not a test): step time, parameter bytes, collectives; writes bench-results/*.json."""
    bin_dir = _install(session)
    _bench(session, bin_dir, "llama_tp", "benchmarks/bench_llama_tp.py")


@nox.session(default=False)
def families(session: nox.Session) -> None:
    """Not a test: every causal-LM, masked-LM, seq2seq, image-classification and vision-language family of
    the installed transformers at TP=2 on tiny configs against the unsharded model; writes
    benchmarks/results/families.json and .md (``-- --only gpt_neox phi3`` for some)."""
    bin_dir = _install(session)
    _run(session, bin_dir, "python", "benchmarks/families.py", *session.posargs)


@nox.session(default=False)
def features(session: nox.Session) -> None:
    """Not a test: every causal-LM family the plan its config ships shards (no plugin), at PP=2, Ulysses SP=2,
    ring SP=2, split_gather TP=2, FSDP=2 and EP=2 over DDP against the unsharded model; writes
    benchmarks/results/features.json and .md, the totals per feature (``-- --only qwen3 olmo2 --features pp
    --merge`` for some)."""
    bin_dir = _install(session)
    _run(session, bin_dir, "python", "benchmarks/features.py", *session.posargs)


@nox.session(default=False)
def matrix(session: nox.Session) -> None:
    """Not a test: every installed family (plugins/shard-*/tests/matrix_*.py) against every feature (TP, the
    sequence modes, PP, FSDP x TP, kernels, lazy init) on 2-4 gloo ranks against the unsharded model, beside
    what each family declares; writes benchmarks/results/matrix.json and .md, fails on a cell that disagrees
    with its declaration (``-- --rows bloom glm4 --features pp`` for some)."""
    bin_dir = _install(session)
    _run(session, bin_dir, "python", "benchmarks/matrix.py", *session.posargs)


@nox.session(name="simulate", default=False)
def simulate(session: nox.Session) -> None:
    """Benchmark (not a test): one process as one rank of 8 (torch's fake backend), every layout's step time,
    memory and MFU beside explain's prediction (benchmarks/bench_simulate.py; on a CPU add ``-- --tiny``)."""
    bin_dir = _install(session)
    _run(session, bin_dir, "python", "benchmarks/bench_simulate.py", *session.posargs)


@nox.session(name="bench-verify", default=False)
def bench_verify(session: nox.Session) -> None:
    """Benchmark (not a test): what ShardConfig(verify=True) costs at optimize, the first step and after."""
    bin_dir = _install(session)
    _bench(session, bin_dir, "verify", "benchmarks/bench_verify.py")


@nox.session(default=False)
def memory(session: nox.Session) -> None:
    """Benchmark (not a test): RSS and time to load a ~0.9 GB Llama at TP=2, vs HuggingFace's loaders."""
    bin_dir = _install(session)
    session.run(str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "accelerate", external=True)  # HF tp_plan
    _bench(session, bin_dir, "load_memory", "benchmarks/bench_load_memory.py")


@nox.session(name="bench-kernels", default=False)
def bench_kernels(session: nox.Session) -> None:
    """Benchmark (not a test): each optimization switch on/off at TP=2; writes bench-results/kernels.json."""
    bin_dir = _install(session)
    _bench(session, bin_dir, "kernels", "benchmarks/bench_kernels.py")


@nox.session(name="bench-gpu", default=False)
def bench_gpu(session: nox.Session) -> None:
    """Benchmark (not a test): Llama-3-8B-shaped layers at TP 1/2/4/8 as the GPUs allow, shardcore vs
    PyTorch TP vs HF tp_plan (tokens/s, MFU, peak memory); ``-- --tiny`` runs it on CPU at tiny size."""
    bin_dir = _install(session)
    session.run(str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "accelerate", external=True)  # HF tp_plan
    _bench(session, bin_dir, "gpu", "benchmarks/bench_gpu.py")


@nox.session(name="bench-param-repr", default=False)
def bench_param_repr(session: nox.Session) -> None:
    """Benchmark (not a test): plain local shards vs DTensor parameters (the prototype) at TP=2: forward +
    backward, clip_grad_norm_, AdamW, the whole step; writes benchmarks/results/param_repr.json."""
    bin_dir = _install(session)
    _bench(session, bin_dir, "param_repr", "benchmarks/bench_param_repr.py")


@nox.session(name="bench-dp", default=False)
def bench_dp(session: nox.Session) -> None:
    """Benchmark (not a test): TP=4, FSDPxTP 2x2, DDPxTP 2x2, FSDP=4, DDP=4, ZeRO-2=4, HSDP 2x2 on 4 ranks, memory
    against explain's prediction; writes benchmarks/results/data_parallel.json."""
    bin_dir = _install(session)
    _bench(session, bin_dir, "data_parallel", "benchmarks/bench_data_parallel.py")


@nox.session(name="bench-pipeline", default=False)
def bench_pipeline(session: nox.Session) -> None:
    """Benchmark (not a test): every pipeline schedule vs TP=2 vs unsharded, bubble fractions, a PNG timeline."""
    bin_dir = _install(session)
    session.run(str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "matplotlib", external=True)  # the PNG
    _bench(session, bin_dir, "pipeline", "benchmarks/bench_pipeline.py")


@nox.session(name="bench-sequence", default=False)
def bench_sequence(session: nox.Session) -> None:
    """Benchmark (not a test): sequence parallelism vs TP=2 vs unsharded at long sequences, a PNG plot."""
    bin_dir = _install(session)
    session.run(str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "matplotlib", external=True)  # the PNG
    _bench(session, bin_dir, "sequence", "benchmarks/bench_sequence.py")


@nox.session(name="bench-auto", default=False)
def bench_auto(session: nox.Session) -> None:
    """Benchmark (not a test): every valid layout of 4 ranks for a Llama, a BERT-MLM and a Mixtral
    at 2 lengths, trained and timed, against explain --auto's predictions and choice; a PNG plot."""
    bin_dir = _install(session)
    session.run(str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "matplotlib", external=True)  # the PNG
    _bench(session, bin_dir, "auto", "benchmarks/bench_auto.py")
    summary = (
        "benchmarks/bench_auto.py",
        "--summarize",
        "benchmarks/results/auto.json",
        "--png",
        "docs/auto_layout.png",
    )
    _run(session, bin_dir, "python", *summary)


@nox.session(name="bench-moe", default=False)
def bench_moe(session: nox.Session) -> None:
    """Benchmark (not a test): a small Mixtral unsharded, at TP=2 and at EP=2 (2 ranks)."""
    bin_dir = _install(session)
    _bench(session, bin_dir, "moe", "benchmarks/bench_moe.py")


@nox.session(name="long-sequence", default=False)
def long_sequence(session: nox.Session) -> None:
    """Demonstration (not a test): a sequence one process cannot train under a memory cap, trained
    with ring_attn over 4 ranks under the same cap per rank, losses equal; bench-results/long_sequence.json."""
    bin_dir = _install(session)
    _run(session, bin_dir, "python", "benchmarks/long_sequence.py", *session.posargs)


@nox.session(name="bench-consistency", default=False)
def bench_consistency(session: nox.Session) -> None:
    """Benchmark (not a test): the cost of the input check and of the sampling sync at TP=2."""
    bin_dir = _install(session)
    _bench(session, bin_dir, "consistency", "benchmarks/bench_consistency.py")


@nox.session(name="bench-overlap", default=False)
def bench_overlap(session: nox.Session) -> None:
    """Benchmark (not a test): whether a gloo all-gather progresses beside a matmul on this machine."""
    bin_dir = _install(session)
    _bench(session, bin_dir, "overlap_probe", "benchmarks/bench_overlap_probe.py")


@nox.session(name="bench-parallelize", default=False)
def bench_parallelize(session: nox.Session) -> None:
    """Benchmark (not a test): shardcore.parallelize of a ~1 GB Llama vs loading it unsharded (RSS, time)."""
    bin_dir = _install(session)
    _bench(session, bin_dir, "parallelize", "benchmarks/bench_parallelize.py")


@nox.session(default=False)
def mutants(session: nox.Session) -> None:
    """Mutation testing (~35 min; ``-- --fast``: CI's subset, ~3 min): deliberate bugs, each caught by the
    check it declares; the full run writes ``docs/mutants.json``."""
    bin_dir = _install(session)
    _run(session, bin_dir, "python", "tests/mutants.py", *session.posargs)


@nox.session(default=False)
def convergence(session: nox.Session) -> None:
    """Benchmark (not a test): MiniLM fine-tuned unsharded, TP=2 and TP=4; accuracy, F1, loss."""
    bin_dir = _install(session)
    # one run: its 5 dropout seeds per setting are the repeats (BENCH_REPEATS still overrides)
    _bench(session, bin_dir, "bert_convergence", "benchmarks/bench_bert_convergence.py", repeats=1)
