"""A Jinja sandbox for chat templates that bounds what one render may cost: time, output and value sizes.

jinja2's ImmutableSandboxedEnvironment keeps a template from reaching Python internals, but not from asking for
a 10 GB string ('x' * 10**10), a tojson indent of 50 million spaces, or 10**10 loop iterations (two nested
range(100000) loops). A template comes with the model file, so it is input like any other: BoundedEnvironment
refuses such requests before they run, and stops a render that outlives its time budget.

How, without threads or signals (a render runs in whatever thread asked for it: the server's handlers too):
  - the template's syntax tree is instrumented before it is compiled (_Instrument, compile_bounded): every
    {% for %} iterates through a guard that charges one step per item, every piece of output (top level,
    macro bodies, {% set %} blocks) goes through a guard that adds its length to the render's total, `a ~ b`
    through one that checks the joined length first, and every list, tuple and dict literal through one that
    weighs it (Budget.weigh). The guards are methods of an extension (_Guards), addressed through
    environment.extensions[...], so no template variable can shadow them;
  - the sandbox's own hooks (call, call_binop, the str.format wrapper) charge a step and check, before the
    operation runs, the size of what it would produce: `*` and `+` on strings/lists/tuples, `**` and `*` on
    integers (in bits), `%` formatting, and the str/bytes methods that can grow a value (center, ljust,
    rjust, zfill, expandtabs, replace, join, translate, format); what they return is weighed;
  - every filter is wrapped the same way (center, indent, format, join, replace, wordwrap, batch, slice, sum,
    pprint checked before they run; the result weighed after);
  - namespace() objects print without their attributes (BoundedNamespace);
  - each step compares the clock with the render's deadline.
A single value may weigh MAX_VALUE (characters or items, nested ones included), a render may write
MAX_WRITTEN characters in all, and it may run for the JinjaTemplate's time limit. Real chat templates stay
far below all three (a 128k-token prompt is about 0.5 M characters).
"""
from __future__ import annotations

import re
import string
import threading
import time
from functools import wraps
from typing import Any, Callable

from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer

MAX_VALUE = 1 << 22      # characters of one string, items of one list/tuple/dict
MAX_WRITTEN = 1 << 24    # characters one render may output, counting every buffer (macros, {% set %} blocks)
MAX_INT_BITS = 1 << 16   # bits of an integer built by * or ** (str() of a larger one fails anyway)
MAX_SMALL_ARG = 64       # tojson indent and separators, lipsum paragraphs
MAX_SLICES = 10000       # the slice filter's column count
MAX_TRACKED = 250_000    # lists, tuples, dicts one render may build (each is remembered with its weight)
MAX_PPRINT = 10_000      # weight of what the pprint filter may lay out (it indents by depth)

_SIZED = (str, bytes, bytearray, list, tuple)
_PLAIN_SCALARS = frozenset({int, float, bool, type(None)})
_ITEMS_VIEW = type({}.items())
# concrete types only: isinstance() against the collections.abc views is slow, and weigh() runs per item
_CONTAINERS = (list, tuple, dict, set, frozenset, type({}.keys()), type({}.values()), _ITEMS_VIEW)
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\*|\d*)(?:\.(\*|\d*))?[hlL]?(.)", re.S)


class LimitError(Exception):
    """A render asked for more than the budget allows; JinjaTemplate turns it into a TemplateError."""


class Budget:
    """What one render has used: steps (loop items, calls, operators), characters written, and the clock;
    and the weight of every container the render has seen.

    Weight: a string's length, 1 for another scalar, 1 + the children's weights for a list, tuple, dict, set or
    dict view: about what str(), tojson, == or hash() walk. Lists of lists can share children ([x, x]
    doubled 40 times is 41 objects and weighs 2**41), so len() alone does not bound those walks. Every
    container a template builds is weighed when it is built (literals, operators, calls and filters), from its
    children's remembered weights; containers cannot change in the immutable sandbox, so a weight stays
    true. Each is kept referenced for the render, so its id() cannot be reused for another object."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.written = 0
        self.weights: dict[int, tuple[Any, int]] = {}

    def weigh(self, value: Any) -> int:
        if isinstance(value, (str, bytes, bytearray)):
            return len(value)
        if not isinstance(value, _CONTAINERS):
            return 1
        known = self.weights.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        total = 1
        if isinstance(value, (dict, _ITEMS_VIEW)):
            pairs = value.items() if isinstance(value, dict) else value
            for k, v in pairs:
                total += 1 + self.weigh(k) + self.weigh(v)
                if total > MAX_VALUE:
                    break
        else:
            weigh = self.weigh
            for child in value:  # plain strings and numbers inline: a list of a million numbers is quick to make
                t = type(child)
                total += len(child) if t is str else 1 if t in _PLAIN_SCALARS else weigh(child)
                if total > MAX_VALUE:
                    break
        _limit(total, f"a {type(value).__name__}")
        self.remember(value, total)
        return total

    def remember(self, value: Any, weight: int) -> None:
        if len(self.weights) >= MAX_TRACKED:
            raise LimitError(f"the template built more than {MAX_TRACKED} lists, tuples and dicts")
        self.weights[id(value)] = (value, weight)

    def step(self) -> None:
        if time.monotonic() > self.deadline:
            raise LimitError(f"rendering took longer than {self.seconds:g} s")

    def write(self, n: int) -> None:
        self.written += n
        if self.written > MAX_WRITTEN:
            raise LimitError(f"the output exceeds {MAX_WRITTEN} characters")
        self.step()


class _Local(threading.local):
    budget: Budget | None = None  # the Budget of the render running in this thread


_local = _Local()


def _budget() -> Budget | None:
    return _local.budget


class active:
    """`with active(budget):` makes budget the current render's (renders in other threads have their own)."""

    def __init__(self, budget: Budget):
        self.budget = budget

    def __enter__(self) -> Budget:
        self.prev, _local.budget = _budget(), self.budget
        return self.budget

    def __exit__(self, *exc) -> None:
        _local.budget = self.prev


def _step() -> None:
    b = _budget()
    if b is not None:
        b.step()


def _limit(n: int, what: str) -> None:
    if n > MAX_VALUE:
        raise LimitError(f"{what} would hold {n} characters or items (at most {MAX_VALUE})")


def check_size(value: Any, what: str = "a value") -> Any:
    """value, once its weight (Budget.weigh; its length outside a render) is known to be within MAX_VALUE."""
    b = _budget()
    if b is not None:
        n = b.weigh(value)
        if n > MAX_VALUE:
            raise LimitError(f"{what} would hold {n} characters or items (at most {MAX_VALUE})")
    elif isinstance(value, (_SIZED, dict)):
        _limit(len(value), what)
    return value


def _str_len(value: Any) -> int:
    """len(str(value)), after checking value's weight (which bounds what str() walks)."""
    if isinstance(value, (str, bytes)):
        return len(value)
    check_size(value)
    return len(str(value))


class BoundedNamespace(Namespace):
    """namespace() whose repr does not show its attributes: one namespace can hold another, and a printed
    chain of them (each holding [previous, previous]) would double with every link. Templates print a
    namespace's attributes, not the namespace."""

    def __repr__(self) -> str:
        return "<Namespace>"


def _int_arg(value: Any, what: str) -> None:
    if isinstance(value, int) and abs(value) > MAX_VALUE:
        raise LimitError(f"{what} is {value} (at most {MAX_VALUE})")


# -- size estimates, made before an operation runs ------------------------------------------------------

def _check_binop(op: str, left: Any, right: Any) -> None:
    if op == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, _SIZED) and isinstance(n, int):
                _limit(len(seq) * max(n, 0), f"{type(seq).__name__} * {n}")
        if isinstance(left, int) and isinstance(right, int) \
                and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise LimitError(f"an integer product of more than {MAX_INT_BITS} bits")
    elif op == "+":
        if isinstance(left, _SIZED) and isinstance(right, _SIZED):
            _limit(len(left) + len(right), f"{type(left).__name__} + {type(right).__name__}")
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1 \
                and (left.bit_length() - 1) * right > MAX_INT_BITS:
            raise LimitError(f"a {left.bit_length()}-bit integer ** {right} has more than {MAX_INT_BITS} bits")
    elif op == "%" and isinstance(left, (str, bytes)):
        check_percent(left, right)


def _arg_len(values) -> int:
    """The longest str() of the arguments a format may substitute (each field can use any of them)."""
    longest = 0
    for v in values:
        try:
            longest = max(longest, _str_len(v))
        except LimitError:
            raise
        except Exception:  # an object whose str() fails fails the format too, later
            pass
    return longest


def check_percent(fmt: str | bytes, args: Any) -> None:
    """`fmt % args`: at most len(fmt) + fields * (longest argument) + the widths and precisions written."""
    text = fmt if isinstance(fmt, str) else fmt.decode("latin-1")
    values = list(args.values()) if isinstance(args, dict) else list(args) if isinstance(args, tuple) else [args]
    fields, widths = 0, 0
    for m in _PERCENT_SPEC.finditer(text):
        if "*" in (m.group(1), m.group(2)):
            raise LimitError("'%' formatting with a '*' width is not allowed in a chat template")
        fields += 1
        widths += int(m.group(1) or 0) + int(m.group(2) or 0)
        _limit(widths, "a '%' format's widths")
    _limit(len(text) + fields * _arg_len(values) + widths, "a '%' formatted string")


def check_format(fmt: str, args: tuple, kwargs: dict) -> None:
    """str.format / format_map: like check_percent; widths computed from other fields ({:{}}) are refused."""
    fields, widths = 0, 0
    try:
        parsed = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # str.format raises the same error itself
    for _, field, spec, _ in parsed:
        if field is None:
            continue
        if spec and "{" in spec:
            raise LimitError("a format spec built from other fields ({:{}}) is not allowed in a chat template")
        fields += 1
        widths += sum(int(d) for d in re.findall(r"\d+", spec or ""))
        _limit(widths, "a format's widths")
    _limit(len(fmt) + fields * _arg_len(list(args) + list(kwargs.values())) + widths, "a formatted string")


def _joined(sep: Any, items: list) -> None:
    total = len(sep) * max(len(items) - 1, 0) if isinstance(sep, _SIZED) else 0
    for item in items:
        total += _str_len(item)
        _limit(total, "a joined string")


def _replaced(s: Any, old: Any, new: Any, count: Any) -> None:
    if not (isinstance(s, (str, bytes)) and isinstance(old, type(s)) and isinstance(new, type(s))):
        return
    n = len(s) + 1 if not old else s.count(old)
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    _limit(len(s) + n * max(len(new) - len(old), 0), "a replaced string")


def _check_method(method: Any, args: tuple, kwargs: dict) -> tuple:
    """Checks a call of a str/bytes method that can grow its value; returns the arguments to pass (join's
    iterable comes back as a list, since measuring it consumed it)."""
    owner, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
    if not isinstance(owner, (str, bytes, bytearray)):
        return args
    if name in ("center", "ljust", "rjust", "zfill") and args:
        _int_arg(args[0], f"the width of {name}()")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            _limit(len(owner) + owner.count("\t" if isinstance(owner, str) else b"\t") * max(size, 0),
                   "expandtabs()")
    elif name == "replace" and len(args) >= 2:
        _replaced(owner, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count", -1))
    elif name == "join" and len(args) == 1:
        items = list(args[0])
        _joined(owner, items)
        return (items,)
    elif name == "translate" and args and isinstance(args[0], dict):
        longest = max((len(v) for v in args[0].values() if isinstance(v, str)), default=1)
        _limit(len(owner) * max(longest, 1), "translate()")
    return args


# -- filters --------------------------------------------------------------------------------------------

def _filter_checks(name: str, head: tuple, args: tuple, kwargs: dict) -> tuple:
    """Checks before the built-in filter `name` runs on args (the value first; `head` is the environment or
    context jinja passes in front of it, if any). Returns the arguments to pass."""
    def arg(i: int, key: str, default=None):
        return args[i] if len(args) > i else kwargs.get(key, default)

    value = arg(0, "value")
    if name == "center":
        _int_arg(arg(1, "width"), "the center filter's width")
    elif name == "indent":
        width = arg(1, "width", 4)
        pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        _int_arg(pad, "the indent filter's width")
        if isinstance(value, str):
            _limit(len(value) + (value.count("\n") + 1) * max(pad, 0), "an indented string")
    elif name == "format" and isinstance(value, str):
        check_percent(value, kwargs or tuple(args[1:]))
    elif name == "join" and args:  # (value, d="", attribute=None)
        items = list(value)
        _joined(arg(1, "d", ""), items)
        args = (items,) + tuple(args[1:])
    elif name == "replace":  # (s, old, new, count=None)
        _replaced(value, arg(1, "old"), arg(2, "new"), arg(3, "count"))
    elif name == "wordwrap":  # (s, width, break_long_words, wrapstring, ...)
        wrap = arg(3, "wrapstring")
        if isinstance(value, str):
            _limit(len(value) * (1 + (len(wrap) if isinstance(wrap, str) else 1)), "a wrapped string")
    elif name == "batch":
        _int_arg(arg(1, "linecount"), "the batch filter's size")
    elif name == "slice":
        n = arg(1, "slices")
        if isinstance(n, int) and n > MAX_SLICES:
            raise LimitError(f"the slice filter's count is {n} (at most {MAX_SLICES})")
    elif name == "pprint":  # lays nested values out one per line, indented by depth
        b = _budget()
        if b is not None and b.weigh(value) > MAX_PPRINT:
            raise LimitError(f"the pprint filter lays out values of weight {MAX_PPRINT} at most")
    elif name == "sum":  # (iterable, attribute=None, start=0): lists summed take quadratic time
        if not isinstance(arg(2, "start", 0), (int, float)):
            raise LimitError("the sum filter adds numbers only in a chat template")
    elif name == "urlize":  # (value, trim_url_limit, nofollow, target, rel, ...): inserted at every link
        for key, i in (("target", 3), ("rel", 4)):
            v = arg(i, key)
            if isinstance(v, str) and len(v) > 256:
                raise LimitError(f"the urlize filter's {key} is {len(v)} characters (at most 256)")
    for v in list(args[1:]) + list(kwargs.values()):
        _int_arg(v, f"an argument of the {name} filter")
    return head + tuple(args)


def _bounded_filter(name: str, fn: Callable) -> Callable:
    skip = 1 if getattr(fn, "jinja_pass_arg", None) is not None else 0  # the context jinja passes first

    @wraps(fn)  # keeps jinja's pass_context/pass_environment mark, so jinja passes the same first argument
    def run(*args, **kwargs):
        _step()
        args = _filter_checks(name, args[:skip], args[skip:], kwargs)
        return check_size(fn(*args, **kwargs), f"the {name} filter's result")
    return run


def bounded_lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    from jinja2.utils import generate_lorem_ipsum

    if not all(isinstance(v, int) for v in (n, min, max)) or n > MAX_SMALL_ARG or max > 1000:
        raise LimitError(f"lipsum() takes at most {MAX_SMALL_ARG} paragraphs of at most 1000 words")
    return generate_lorem_ipsum(n, html, min, max)


# -- the environment and the instrumented syntax tree ----------------------------------------------------

class _Guards(Extension):
    """The functions instrumented templates call (as environment.extensions[identifier].NAME)."""

    def iterate(self, iterable):
        _step()
        for item in iterable:
            _step()
            yield item

    def output(self, value):
        """One piece of output, written as str(value) by the template code right after."""
        b = _budget()
        if b is not None:
            b.write(_str_len(value))
        return value

    def concat(self, *values):
        """`a ~ b ~ ...`: str() of each, joined (what jinja's own concatenation does without autoescape)."""
        for v in values:
            check_size(v)
        parts = [str(v) for v in values]
        _limit(sum(len(p) for p in parts), "a '~' concatenation")
        return "".join(parts)

    def built(self, value):
        """A list, tuple or dict literal just built: weighed (Budget.weigh)."""
        return check_size(value, f"a {type(value).__name__} literal")


class _Instrument(NodeTransformer):
    def __init__(self, identifier: str):
        self.identifier = identifier

    def _call(self, name: str, args: list, lineno: int) -> nodes.Call:
        return nodes.Call(nodes.ExtensionAttribute(self.identifier, name, lineno=lineno), args, [], None, None,
                          lineno=lineno)

    def visit_For(self, node: nodes.For) -> nodes.Node:
        node = self.generic_visit(node)
        node.iter = self._call("iterate", [node.iter], node.lineno)
        return node

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        node = self.generic_visit(node)
        node.nodes = [self._call("output", [nodes.Const(n.data, lineno=n.lineno)
                                            if isinstance(n, nodes.TemplateData) else n], n.lineno)
                      for n in node.nodes]
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        node = self.generic_visit(node)
        return self._call("concat", node.nodes, node.lineno)

    def _literal(self, node: nodes.Node) -> nodes.Node:
        node = self.generic_visit(node)
        if getattr(node, "ctx", "load") != "load":  # a tuple assigned to ({% for a, b in ... %}) stays
            return node
        return self._call("built", [node], node.lineno)

    visit_List = visit_Tuple = visit_Dict = _literal


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment whose renders stay within a Budget (see the module docstring)."""

    intercepted_binops = frozenset({"*", "+", "**", "%"})

    def __init__(self, **options):
        options["extensions"] = list(options.get("extensions", ())) + [_Guards]
        super().__init__(**options)
        self.filters = {name: _bounded_filter(name, fn) for name, fn in self.filters.items()}
        self.globals["lipsum"] = bounded_lipsum
        self.globals["namespace"] = BoundedNamespace

    def add_filter(self, name: str, fn: Callable) -> None:
        self.filters[name] = _bounded_filter(name, fn)

    def compile_bounded(self, source: str):
        """The Template for `source`, with its loops and outputs guarded."""
        tree = self.parse(source)
        tree = _Instrument(_Guards.identifier).visit(tree)
        tree.set_environment(self)
        return self.from_string(tree)

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        _step()
        _check_binop(operator, left, right)
        result = super().call_binop(context, operator, left, right)
        b = _budget()
        if b is not None and operator in ("+", "*") and isinstance(result, (list, tuple)):
            # the weight follows from the operands' without walking the result: a + b holds both operands'
            # items, s * n holds s's n times (repeated doubling would otherwise re-walk millions of items)
            if operator == "+":
                weight = b.weigh(left) + b.weigh(right) - 1
            else:
                seq, n = (left, right) if isinstance(left, (list, tuple)) else (right, left)
                weight = 1 + max(n, 0) * (b.weigh(seq) - 1)
            _limit(weight, f"the result of {operator!r}")
            b.remember(result, weight)
            return result
        return check_size(result, f"the result of {operator!r}")

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own signature)
        _step()
        args = _check_method(__obj, args, kwargs)
        return check_size(super().call(__context, __obj, *args, **kwargs), "a call's result")

    def wrap_str_format(self, value: Any):
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        fmt, is_map = value.__self__, value.__name__ == "format_map"

        @wraps(wrapper)
        def checked(*args, **kwargs):
            if is_map:
                check_format(fmt, (), dict(args[0]) if len(args) == 1 and isinstance(args[0], dict) else {})
            else:
                check_format(fmt, args, kwargs)
            return wrapper(*args, **kwargs)
        return checked
