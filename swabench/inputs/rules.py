"""Skip rules: a small, bounded evaluator for the `when` expressions of scenario files.

A rule such as ``group == 'verify' and window_left >= kv_len`` is parsed once with `ast`, checked
against a short grammar and turned into nested closures. Evaluating it never calls `eval`, so the
limits below hold for every point: no rule can allocate gigabytes, recurse without end, or fail
with anything but a RuleError that names the part of the rule at fault.

Grammar: comparisons (== != < <= > >= in, not in, is, is not) of names, integer / string / bool /
None constants and integer arithmetic (+ - * // % and unary minus), combined with and / or / not.
A literal list such as ``('fa2', 'fa3')`` may only follow ``in`` / ``not in``.
"""

from __future__ import annotations

import ast
import difflib
import operator
import warnings

MAX_TEXT = 1000       # characters in a rule
MAX_NODES = 200       # names, constants and operations in a rule
MAX_DEPTH = 32        # nesting of sub-expressions
MAX_LIST = 64         # elements of a literal list after `in`
MAX_STR = 100         # characters in a string constant
MAX_CONST = 2 ** 63   # an integer constant's magnitude is below this
MAX_VALUE = 2 ** 64   # magnitude of any value arithmetic may take or give

ALLOWED = "only comparisons, and/or/not and + - * // % are allowed"
ARITH = {ast.Add: ("+", operator.add), ast.Sub: ("-", operator.sub), ast.Mult: ("*", operator.mul),
         ast.FloorDiv: ("//", operator.floordiv), ast.Mod: ("%", operator.mod)}
ORDER = {ast.Lt: ("<", operator.lt), ast.LtE: ("<=", operator.le),
         ast.Gt: (">", operator.gt), ast.GtE: (">=", operator.ge)}
EQUAL = {ast.Eq: ("==", operator.eq), ast.NotEq: ("!=", operator.ne),
         ast.Is: ("is", operator.is_), ast.IsNot: ("is not", operator.is_not)}
MEMBER = {ast.In: lambda x, items: x in items, ast.NotIn: lambda x, items: x not in items}
NODE_WORDS = {ast.Call: "a function call", ast.Attribute: "an attribute", ast.Subscript: "indexing",
              ast.Lambda: "a lambda", ast.IfExp: "an if/else", ast.NamedExpr: "an assignment (:=)",
              ast.Dict: "a dict", ast.Set: "a set", ast.JoinedStr: "an f-string",
              ast.ListComp: "a comprehension", ast.GeneratorExp: "a generator"}


class RuleError(ValueError):
    """A rule that cannot be compiled or evaluated, phrased for the person who wrote it; the caller
    adds the file and the field (e.g. ``skip[2].when``)."""


class Rule:
    """A compiled rule: `text` is its source (for messages), `where` the field it came from."""

    __slots__ = ("text", "where", "_fn")

    def __init__(self, text: str, fn, where: str = ""):
        self.text, self.where, self._fn = text, where, fn

    def evaluate(self, namespace: dict) -> bool:
        """True or False for one point; RuleError when the point's values do not fit the rule."""
        return self._fn(namespace)

    def __repr__(self):
        return f"Rule({self.text!r})"


def compile_rule(expr, names, *, where: str = "") -> Rule:
    """Check `expr` against the grammar and the limits, and turn it into a Rule; only `names` may
    appear in it. Everything that can be refused without values is refused here."""
    if not isinstance(expr, str):
        raise RuleError(f"must be an expression string, got {_short(repr(expr))}")
    if len(expr) > MAX_TEXT:
        raise RuleError(f"is {len(expr)} characters long; a rule may have at most {MAX_TEXT} "
                        f"(split it into several [[skip]] rules)")
    source = expr.strip()  # TOML multi-line strings bring newlines and indentation
    try:
        with warnings.catch_warnings():  # e.g. "invalid decimal literal" for `1if`: not the author's concern
            warnings.simplefilter("ignore")
            tree = ast.parse(source, mode="eval")
    except SyntaxError as e:
        hint = " (wrap a rule that spans several lines in parentheses)" if "\n" in source else ""
        raise RuleError(f"not a valid expression ({e.msg}): {_short(repr(expr))}{hint}") from None
    except (RecursionError, MemoryError, ValueError):
        raise RuleError(f"is too deeply nested to read: {_short(repr(expr))}") from None
    _check_size(tree.body)
    compiler = _Compiler(source, tuple(names))
    fn = compiler.value(tree.body)
    if not _is_boolean(tree.body):
        raise RuleError(f"must be a comparison that is true or false, e.g. `prefix_len > 0`; "
                        f"`{compiler.show(tree.body)}` is a value, not a condition")
    return Rule(expr, fn, where)


def _check_size(root: ast.expr) -> None:
    """Count and depth first, without recursion: the compiler below recurses once per level."""
    count, stack = 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise RuleError(f"is too long: more than {MAX_NODES} names, constants and operations "
                            f"(split it into several [[skip]] rules)")
        if depth > MAX_DEPTH:
            raise RuleError(f"is too deeply nested: more than {MAX_DEPTH} levels "
                            f"(split it into several [[skip]] rules)")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node)
                     if isinstance(child, ast.expr))


def _is_boolean(node: ast.expr) -> bool:
    """Whether `node` is a condition: a comparison, a `not`, and/or of conditions, True or False."""
    if isinstance(node, ast.BoolOp):
        return all(_is_boolean(v) for v in node.values)
    if isinstance(node, ast.Constant):
        return isinstance(node.value, bool)
    return isinstance(node, ast.Compare) or isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)


def _singleton(node: ast.expr) -> bool:
    """None, True or False written in the rule: the only things `is` may test for."""
    return isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, bool))


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _kind(value) -> str:
    """How a value reads in a message."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return f"a boolean ({value})"
    if isinstance(value, int):
        return f"an integer ({_short(str(value), 24)})"
    if isinstance(value, str):
        return f"a string ({_short(repr(value), 24)})"
    return f"a {type(value).__name__}"


class _Compiler:
    """Turns checked AST nodes into closures ``fn(namespace) -> value``; refuses what the grammar
    does not allow, with the offending part of the source in the message."""

    def __init__(self, source: str, names: tuple):
        self.source, self.names = source, names

    def show(self, node: ast.AST) -> str:
        return _short(ast.get_source_segment(self.source, node) or ast.unparse(node))

    def blame(self, node: ast.expr, value) -> str:
        """`name` is not set / `part` is a string ('x') -- for type errors at evaluation."""
        if value is None and isinstance(node, ast.Name):
            return f"`{node.id}` is not set in this sweep group (None)"
        return f"`{self.show(node)}` is {_kind(value)}"

    def value(self, node: ast.expr):
        if isinstance(node, ast.Constant):
            return self.constant(node)
        if isinstance(node, ast.Name):
            return self.name(node)
        if isinstance(node, ast.BoolOp):
            return self.bool_op(node)
        if isinstance(node, ast.UnaryOp):
            return self.unary(node)
        if isinstance(node, ast.BinOp):
            return self.arith(node)
        if isinstance(node, ast.Compare):
            return self.compare(node)
        if isinstance(node, (ast.Tuple, ast.List)):
            raise RuleError(f"a list such as `{self.show(node)}` may only follow `in` or `not in`")
        word = NODE_WORDS.get(type(node), type(node).__name__)
        raise RuleError(f"{ALLOWED}; found {word} `{self.show(node)}`")

    def constant(self, node: ast.Constant):
        v = self.checked_constant(node)
        return lambda ns: v

    def checked_constant(self, node: ast.Constant):
        """The constant's value, if it is of an allowed type and size."""
        v = node.value
        if v is None or isinstance(v, bool):
            pass
        elif isinstance(v, int):
            if abs(v) >= MAX_CONST:
                raise RuleError(f"the number {_short(str(v), 24)} is too large (integers below 2**63)")
        elif isinstance(v, str):
            if len(v) > MAX_STR:
                raise RuleError(f"the string {_short(repr(v), 24)} is {len(v)} characters long "
                                f"(at most {MAX_STR})")
        else:
            raise RuleError(f"only integers, strings, True, False and None may appear as constants; "
                            f"found {type(v).__name__} `{self.show(node)}`")
        return v

    def name(self, node: ast.Name):
        name = node.id
        if name not in self.names:
            close = difflib.get_close_matches(name, self.names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise RuleError(f"unknown name {name!r}{hint}; allowed: {', '.join(self.names)}")

        def get(ns):
            try:
                return ns[name]
            except KeyError:
                raise RuleError(f"`{name}` has no value for this point") from None
        return get

    def condition(self, node: ast.expr, where: str):
        if not _is_boolean(node):
            raise RuleError(f"{where} combines comparisons; `{self.show(node)}` is a value, not a "
                            f"condition (write e.g. `{self.show(node)} > 0`)")
        return self.value(node)

    def bool_op(self, node: ast.BoolOp):
        word = "`and`" if isinstance(node.op, ast.And) else "`or`"
        fns = tuple(self.condition(v, word) for v in node.values)  # conditions give True / False
        if isinstance(node.op, ast.And):
            def all_of(ns):
                for fn in fns:
                    if not fn(ns):
                        return False
                return True
            return all_of

        def any_of(ns):
            for fn in fns:
                if fn(ns):
                    return True
            return False
        return any_of

    def unary(self, node: ast.UnaryOp):
        if isinstance(node.op, ast.Not):
            fn = self.condition(node.operand, "`not`")
            return lambda ns: not fn(ns)
        if not isinstance(node.op, ast.USub):
            raise RuleError(f"{ALLOWED}; found `{self.show(node)}`")
        self.static_int(node.operand, "-", node)
        fn, operand, text = self.value(node.operand), node.operand, self.show(node)

        def negate(ns):
            a = fn(ns)
            if type(a) is not int:
                raise RuleError(f"cannot compute `{text}`: `-` needs an integer, but {self.blame(operand, a)}")
            if not -MAX_VALUE <= a <= MAX_VALUE:
                raise RuleError(f"value too large in `{text}` (more than 2**64)")
            return -a
        return negate

    def static_int(self, operand: ast.expr, sym: str, node: ast.expr) -> None:
        """Refuse arithmetic on a string / bool / None constant now, e.g. `'a' * 4000000000`."""
        if isinstance(operand, ast.Constant) and type(operand.value) is not int:
            raise RuleError(f"`{self.show(node)}`: `{sym}` works on integers only, but "
                            f"`{self.show(operand)}` is {_kind(operand.value)}")

    def arith(self, node: ast.BinOp):
        if type(node.op) not in ARITH:
            raise RuleError(f"{ALLOWED}; found `{self.show(node)}`")
        sym, op = ARITH[type(node.op)]
        self.static_int(node.left, sym, node)
        self.static_int(node.right, sym, node)
        left, right, text = self.value(node.left), self.value(node.right), self.show(node)
        lnode, rnode, divides = node.left, node.right, sym in ("//", "%")

        def compute(ns):
            a, b = left(ns), right(ns)
            if type(a) is not int or type(b) is not int:
                bad = [self.blame(n, v) for n, v in ((lnode, a), (rnode, b)) if type(v) is not int]
                raise RuleError(f"cannot compute `{text}`: `{sym}` needs integers, but {' and '.join(bad)}")
            if divides and b == 0:
                raise RuleError(f"division by zero in `{text}`")
            if not (-MAX_VALUE <= a <= MAX_VALUE and -MAX_VALUE <= b <= MAX_VALUE):
                raise RuleError(f"value too large in `{text}` (more than 2**64)")
            c = op(a, b)
            if not -MAX_VALUE <= c <= MAX_VALUE:
                raise RuleError(f"value too large in `{text}` (more than 2**64)")
            return c
        return compute

    def compare(self, node: ast.Compare):
        text, operands = self.show(node), [node.left, *node.comparators]
        fns, tests = [self.value(node.left)], []
        for i, (op, right) in enumerate(zip(node.ops, node.comparators)):
            left = operands[i]
            if type(op) in MEMBER:
                fns.append(self.member_list(right, node, last=i == len(node.ops) - 1))
                tests.append(MEMBER[type(op)])
                continue
            fns.append(self.value(right))
            if type(op) in ORDER:
                tests.append(self.ordering(*ORDER[type(op)], left, right, text))
            else:
                sym, test = EQUAL[type(op)]
                if sym.startswith("is") and not (_singleton(left) or _singleton(right)):
                    raise RuleError(f"`{sym}` only tests for None, True or False (e.g. `prefix_len is None`); "
                                    f"use == or != to compare values in `{text}`")
                tests.append(test)
        if len(tests) == 1:
            (left, right), (test,) = fns, tests
            return lambda ns: test(left(ns), right(ns))
        first, pairs = fns[0], tuple(zip(tests, fns[1:]))

        def chain(ns):  # a < b < c: each operand evaluated once, stop at the first False
            a = first(ns)
            for test, fn in pairs:
                b = fn(ns)
                if not test(a, b):
                    return False
                a = b
            return True
        return chain

    def member_list(self, node: ast.expr, compare: ast.Compare, last: bool):
        """The literal list after `in`: constants only (a negative number counts), evaluated now."""
        if not isinstance(node, (ast.Tuple, ast.List)) or not last:
            raise RuleError(f"`in` and `not in` need a literal list on their right, e.g. "
                            f"`backend in ('fa2', 'fa3')`; found `{self.show(compare)}`")
        if len(node.elts) > MAX_LIST:
            raise RuleError(f"the list `{self.show(node)}` has {len(node.elts)} elements (at most {MAX_LIST})")
        items = []
        for elt in node.elts:
            neg = isinstance(elt, ast.UnaryOp) and isinstance(elt.op, ast.USub)
            const = elt.operand if neg else elt
            if not isinstance(const, ast.Constant) or neg and type(const.value) is not int:
                raise RuleError(f"the list after `in` may hold only constants; found `{self.show(elt)}`")
            v = self.checked_constant(const)
            items.append(-v if neg else v)
        items = tuple(items)
        return lambda ns: items

    def ordering(self, sym: str, op, lnode: ast.expr, rnode: ast.expr, text: str):
        """< <= > >= between two integers or two strings only; never between None and a number."""
        def test(a, b):
            ta = type(a)
            if ta is type(b) and (ta is int or ta is str):
                return op(a, b)
            bad = [self.blame(n, v) for n, v in ((lnode, a), (rnode, b)) if v is None]
            if not bad:
                bad = [self.blame(lnode, a), self.blame(rnode, b)]
            raise RuleError(f"cannot compare `{text}`: `{sym}` needs two integers or two strings, but "
                            f"{' and '.join(bad)}")
        return test
