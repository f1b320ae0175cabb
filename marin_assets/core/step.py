"""Step: a plain description of one pipeline output.

A step is a name, a plain function that writes the output to the path it is given, the steps
it reads, and the values that change its output. Its identity (`hash`) is computed once, at
definition time, so that an unencodable attribute or a bad name fails where it was written.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from marin_assets.core.checks import Check
from marin_assets.core.identity import UnhashableAttrError, identity_hash
from marin_assets.core.paths import join_path, storage_prefix

if TYPE_CHECKING:
    from marin_assets.core.estimate import EstimateInputs, WorkEstimate

_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


class StepDefinitionError(ValueError):
    """A step is malformed: bad name, unencodable hash_attrs, conflicting definitions."""


def validate_name(name: str) -> str:
    """Names are slash-separated segments of letters, digits, `_`, `-`, `.`; never `..`."""
    if not isinstance(name, str) or not name:
        raise StepDefinitionError(f"step name must be a non-empty string, got {name!r}")
    problem = None
    if name.startswith("/"):
        problem = "it starts with '/' (names are relative; use override_output_path for absolute paths)"
    elif ".." in name:
        problem = "it contains '..'"
    elif any(segment == "" for segment in name.split("/")):
        problem = "it has an empty segment ('//' or a trailing '/')"
    else:
        bad = [s for s in name.split("/") if not _SEGMENT.match(s)]
        if bad:
            problem = (
                f"segment {bad[0]!r} is not letters, digits, '_', '-' or '.' starting with a"
                " letter, digit or '_'"
            )
    if problem:
        raise StepDefinitionError(f"invalid step name {name!r}: {problem}")
    return name


def validate_override(step_name: str, override: str) -> None:
    """An `override_output_path` must name a place: a relative path under the prefix (valid like a
    name), an absolute path other than `/`, or a URL with a scheme and something after it."""
    problem = None
    if not isinstance(override, str) or not override.strip():
        problem = "is empty"
    elif override != override.strip():
        problem = "has leading or trailing whitespace"
    elif "://" in override:
        scheme, _, rest = override.partition("://")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.\-]*", scheme):
            problem = f"has no valid URL scheme before '://' (got {scheme!r})"
        elif not rest.strip("/"):
            problem = f"is a bare '{scheme}://' that names no bucket or folder"
    elif override.startswith("/"):
        if not override.strip("/"):
            problem = "is the root folder '/'"
    else:
        try:
            validate_name(override.rstrip("/"))
        except StepDefinitionError as e:
            problem = (f"must stay under the prefix ({str(e).split(': ', 1)[1]}); give an absolute path or URL to"
                       " adopt data elsewhere")
    if problem:
        raise StepDefinitionError(f"step {step_name!r}: override_output_path {override!r} {problem}")


@dataclass(frozen=True)
class Resources:
    """What a step needs to run. Not part of identity: hardware does not change the output."""

    cpu: float = 1.0
    """CPU cores for the step's function."""
    memory_gb: float | None = None
    """Memory in GiB to reserve, or None for no reservation."""
    gpu: float = 0.0
    """Number of GPUs."""
    gpu_type: str | None = None
    """Accelerator type of the GPUs (e.g. `H100`), or None for any."""
    tpu_type: str | None = None
    """TPU slice type (e.g. `v4-8`, `v5e-16`), or None for no TPU."""
    tpu_count: int = 0
    """TPU chips per host (Ray's `{"TPU": n}`); 0 means the whole host when `tpu_type` is set."""
    hosts: int = 1
    """Hosts (Ray nodes) the step spans, each running one process with `cpu`, `gpu` and `memory_gb`; more than
    one: the processes join one JAX program (a multi-node GPU run, or CPU hosts). A TPU slice's hosts come from
    its `tpu_type`."""

    def __post_init__(self) -> None:
        if self.cpu < 0 or self.gpu < 0 or self.tpu_count < 0:
            raise StepDefinitionError(f"resource counts must be non-negative: {self}")
        if self.hosts < 1:
            raise StepDefinitionError(f"hosts must be at least 1: {self}")
        if self.hosts > 1 and self.tpu_type:
            raise StepDefinitionError(f"a TPU slice's hosts come from its type ({self.tpu_type}),"
                                      f" not hosts={self.hosts}")
        if self.memory_gb is not None and self.memory_gb <= 0:
            raise StepDefinitionError(f"memory_gb must be positive: {self}")
        if self.tpu_count and not self.tpu_type:
            raise StepDefinitionError(f"tpu_count={self.tpu_count} needs a tpu_type: {self}")


@dataclass(frozen=True, eq=False)
class Step:
    """One output of the pipeline, served as one Dagster asset."""

    name: str
    """Readable, slash-separated (`raw/tinystories`); becomes the asset key."""
    fn: Callable[[str], Any] = field(repr=False)
    """Plain function writing the output under the path it receives; may return a typed result."""
    deps: Sequence[Step] = ()
    """Steps whose outputs `fn` reads."""
    hash_attrs: Mapping[str, Any] = field(default_factory=dict)
    """Every value that changes the output."""
    resources: Resources = Resources()
    """What `fn` needs to run."""
    override_output_path: str | None = None
    """Adopt an existing location: relative → under the prefix, absolute or URL → as-is."""
    kind: str = "python"
    """What sort of step this is (download, tokenize, train, eval…): the asset's kind tag."""
    description: str | None = None
    """Shown in the UI; defaults to the docstring of `fn` (or of the function it wraps)."""
    source_version: Callable[[], str | None] | None = field(default=None, repr=False)
    """For steps copying a source that can change under a fixed identity (a branch, a URL):
    returns the source's current version (a commit sha, a digest of sizes and etags). It is
    recorded with the output, read by the source sensor to notice changes, and flows into
    downstream records so their cached outputs are recomputed when it changes. Not identity."""
    kinds: Sequence[str] = ()
    """Technologies it uses beyond `kind` (`levanter`, `huggingface`): more kind tags in the UI."""
    checks: Sequence[Check] = ()
    """Verifications of the output run with every materialization (asset checks in Dagster)."""
    estimate: Callable[[EstimateInputs], WorkEstimate] | None = field(default=None, repr=False)
    """Its work before it runs — FLOPs, tokens, bytes read (`core/estimate.py`) — which `marin-assets plan`
    prices on its resources; given its own result, the work it did. None: no work model. Not identity."""

    def __post_init__(self) -> None:
        validate_name(self.name)
        if not callable(self.fn):
            raise StepDefinitionError(f"step {self.name!r}: fn must be callable, got {self.fn!r}")
        if self.override_output_path is not None:
            validate_override(self.name, self.override_output_path)
        if self.estimate is not None and not callable(self.estimate):
            raise StepDefinitionError(f"step {self.name!r}: estimate must be callable or None")
        if self.source_version is not None and not callable(self.source_version):
            raise StepDefinitionError(f"step {self.name!r}: source_version must be callable or None")
        deps = tuple(self.deps)
        for dep in deps:
            if not isinstance(dep, Step):
                raise StepDefinitionError(
                    f"step {self.name!r}: deps must be Steps, got {type(dep).__name__} {dep!r}"
                )
        object.__setattr__(self, "deps", deps)
        object.__setattr__(self, "kinds", tuple(self.kinds))
        object.__setattr__(self, "checks", tuple(self.checks))
        names = [c.name for c in self.checks]
        if len(set(names)) != len(names) or not all(re.fullmatch(r"[A-Za-z0-9_]+", n) for n in names):
            raise StepDefinitionError(f"step {self.name!r}: check names must be unique identifiers, got {names}")
        if not isinstance(self.hash_attrs, Mapping):
            raise StepDefinitionError(f"step {self.name!r}: hash_attrs must be a mapping")
        try:
            digest = identity_hash(self.name, self.hash_attrs, [d.name_with_hash for d in deps])
        except UnhashableAttrError as e:
            raise StepDefinitionError(f"step {self.name!r}: {e}") from None
        object.__setattr__(self, "_hash", digest)

    @property
    def hash(self) -> str:
        """8 hex chars identifying exactly what produces this output."""
        return str(self.__dict__["_hash"])

    @property
    def name_with_hash(self) -> str:
        return f"{self.name}_{self.hash}"

    @property
    def output_path(self) -> str:
        """Where the output lives under the current storage prefix."""
        return self.output_path_under(storage_prefix())

    def output_path_under(self, prefix: str) -> str:
        override = self.override_output_path
        if override is None:
            return join_path(prefix, self.name_with_hash)
        if override.startswith("/") or "://" in override:
            return override.rstrip("/")
        return join_path(prefix, override)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Step) and (self.name, self.hash) == (other.name, other.hash)

    def __hash__(self) -> int:
        return hash((self.name, self.hash))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled — for a Ray worker, say — as a reference: its place in the graph, not its function.

        A worker runs one step's `fn` (sent on its own); the steps that function reads are
        needed only for their paths and typed fields. So a pickled step keeps every field but
        `fn`, `checks`, `source_version` and `estimate`, and the graph under it is sent as one flat list
        (`_flatten`): a chain thousands of steps deep pickles without deep recursion.
        """
        return (_rebuild, (_flatten(self),))


def made_by(fn: Callable[..., Any]) -> str:
    """A step description: what `fn`'s docstring says it makes, and where `fn` is."""
    doc = inspect.getdoc(fn)
    where = f"`{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}`"
    return f"{doc}\n\nMade by {where}." if doc else f"Made by {where}."


def walk(steps: Sequence[Step]) -> list[Step]:
    """All steps reachable from `steps`, dependencies first, each identity once.

    Iterative (an explicit stack), so a graph thousands of steps deep walks like a wide one.
    Two different steps (different hashes) with one name are an error: they would be one
    asset key with two meanings.
    """
    order: list[Step] = []
    seen: dict[str, Step] = {}

    def check(step: Step) -> bool:
        """True if `step` was already placed; raises if another step has its name."""
        known = seen.get(step.name)
        if known is None:
            return False
        if known.hash != step.hash:
            raise StepDefinitionError(
                f"two different steps are named {step.name!r} (hashes {known.hash} and"
                f" {step.hash}); give them different names"
            )
        return True

    for root in steps:
        if check(root):
            continue
        stack: list[tuple[Step, int]] = [(root, 0)]
        while stack:
            step, next_dep = stack[-1]
            if next_dep < len(step.deps):
                stack[-1] = (step, next_dep + 1)
                dep = step.deps[next_dep]
                if not check(dep):
                    stack.append((dep, 0))
                continue
            stack.pop()
            if not check(step):  # a diamond may have placed it meanwhile
                seen[step.name] = step
                order.append(step)
    return order


# --- pickling as a reference (Step.__reduce__) ------------------------------------------------

_NOT_SENT = ("fn", "checks", "source_version", "estimate")


@dataclass(frozen=True)
class _Ref:
    """Index of a step in a flattened graph."""

    index: int


def _not_here(output_path: str) -> None:
    raise RuntimeError(f"this step was received as a reference (its output is {output_path}); its function runs"
                       " only where it is materialized")


def _step_refs(value: Any) -> list[Step]:
    """The steps a field value holds: a step, or a sequence of steps (deps)."""
    if isinstance(value, Step):
        return [value]
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, Step) for v in value):
        return list(value)
    return []


def _flatten(root: Step) -> list[tuple[type[Step], dict[str, Any], str]]:
    """Every step reachable from `root` through its fields, dependencies first, root last, as
    (class, fields with steps replaced by `_Ref`s, hash). Iterative: no depth limit."""
    index: dict[int, int] = {}
    records: list[tuple[type[Step], dict[str, Any], str]] = []
    stack: list[tuple[Step, bool]] = [(root, False)]
    while stack:
        step, expanded = stack.pop()
        if id(step) in index:
            continue
        fields = [f.name for f in dataclasses.fields(step) if f.name not in _NOT_SENT]
        if not expanded:
            stack.append((step, True))
            stack.extend((s, False) for f in fields for s in _step_refs(getattr(step, f)) if id(s) not in index)
            continue

        def ref(value: Any) -> Any:
            held = _step_refs(value)
            if not held:
                return value
            refs = [_Ref(index[id(s)]) for s in held]
            return refs[0] if isinstance(value, Step) else tuple(refs)

        index[id(step)] = len(records)
        records.append((type(step), {f: ref(getattr(step, f)) for f in fields}, step.hash))
    return records


def _rebuild(records: list[tuple[type[Step], dict[str, Any], str]]) -> Step:
    """The root of a flattened graph, as reference steps (no function, no checks)."""
    built: list[Step] = []

    def resolve(value: Any) -> Any:
        if isinstance(value, _Ref):
            return built[value.index]
        if isinstance(value, tuple) and value and all(isinstance(v, _Ref) for v in value):
            return tuple(built[v.index] for v in value)
        return value

    for cls, fields, digest in records:
        step: Step = object.__new__(cls)
        for name, value in fields.items():
            object.__setattr__(step, name, resolve(value))
        object.__setattr__(step, "fn", _not_here)
        object.__setattr__(step, "checks", ())
        object.__setattr__(step, "source_version", None)
        object.__setattr__(step, "estimate", None)
        object.__setattr__(step, "_hash", digest)
        built.append(step)
    return built[-1]
