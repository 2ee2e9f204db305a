"""Source-level facts the bytecode rewrite needs (version-neutral).

The rewrite works on bytecode, but statement boundaries, the text shown in a
crash report and a few handler properties (does this ``except`` always
re-raise?) are facts about the source.  ``ModuleSource`` parses a file once and
answers them by position: every 3.11+ instruction carries the
(line, column) span of the AST node it was compiled from.
"""

from __future__ import annotations

import ast
import bisect
import types
from collections.abc import Iterator
from functools import cached_property, lru_cache

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import cast
else:
    def cast(_type, value):
        return value

_FUNC = (ast.FunctionDef, ast.AsyncFunctionDef)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)

Position = tuple[int | None, int | None, int | None, int | None]


def _start(node: ast.AST) -> tuple[int, int]:
    """Where a statement starts: a decorated ``def`` or ``class`` at its first
    decorator (the decorators run as part of it; the node's own position is
    its ``def`` line)."""
    decorators = getattr(node, "decorator_list", None)
    if decorators:
        return (decorators[0].lineno, decorators[0].col_offset)
    return (node.lineno, node.col_offset)  # type: ignore[attr-defined]


def _span(node: ast.AST) -> tuple[int, int, int, int]:
    return (*_start(node), node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]


#: ``_block_fields`` of each statement class met
_BLOCK_FIELDS: dict[type, tuple[tuple[str, ...], bool, bool]] = {}


def _block_fields(cls: type) -> tuple[tuple[str, ...], bool, bool]:
    """Where a statement of class ``cls`` holds the statements nested in it:
    its ``body``/``orelse``/``finalbody`` fields, and do its ``handlers``,
    its ``cases``, have bodies (nothing: a simple statement, or a nested
    scope, which compiles to its own code object)."""
    known = _BLOCK_FIELDS.get(cls)
    if known is None:
        fields = () if issubclass(cls, _SCOPES) else getattr(cls, "_fields", ())
        known = _BLOCK_FIELDS[cls] = (
            tuple(n for n in ("body", "orelse", "finalbody") if n in fields),
            "handlers" in fields, "cases" in fields)
    return known


def _child_blocks(node: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The statement lists nested directly in a compound statement."""
    names, handlers, cases = _block_fields(type(node))
    for name in names:
        block = getattr(node, name, None)
        if block:
            yield block
    if handlers:
        for handler in getattr(node, "handlers", ()) or ():
            yield handler.body
    if cases:
        for case in getattr(node, "cases", ()) or ():
            yield case.body


def contains(span: tuple[int, int, int, int], pos: Position) -> bool:
    """Is the instruction position ``pos`` inside the source ``span``?"""
    return _contains(span, pos)


def _contains(span: tuple[int, int, int, int], pos: Position) -> bool:
    line, end_line, col, end_col = pos
    if line is None:
        return False
    s_line, s_col, e_line, e_col = span
    if col is None or end_col is None or end_line is None:
        return s_line <= line <= e_line
    return (s_line, s_col) <= (line, col) and (end_line, end_col) <= (e_line, e_col)


#: the statements nested in a simple statement (never changed)
_NO_LEVEL: tuple[list, list, list] = ([], [], [])
_SIMPLE = ((), False, False)  # (``_block_fields`` of a simple statement)


class StatementIndex:
    """Maps instruction positions to the innermost statement of one scope.

    Each block's statements are sorted and disjoint, so a lookup bisects on
    the start position at every nesting level: O(depth x log n), not a scan
    of the block (a 10,000-statement function vaccinated in minutes)."""

    def __init__(self, body: list[ast.stmt]):
        self.body = body
        #: 0 (the body) or a statement's id -> the statements nested in it
        #: directly, sorted: their starts, spans, and themselves (empty
        #: lists: a simple statement)
        self._levels: dict[int, tuple[list, list, list[ast.stmt]]] = {}
        #: (span, statement) of the simple statement found last: a code
        #: object's instructions come statement by statement, and a
        #: position inside a statement without statements of its own is that
        #: statement's (the bisection, for a run of instructions, once)
        self._last: tuple[tuple[int, int, int, int], ast.stmt] | None = None
        #: the simple statements (no statement nested in them), in source
        #: order, with their spans; where ``locate`` found one last
        self._simple: list[tuple[tuple[int, int, int, int], ast.stmt]] | None = None
        self._simple_starts: list[tuple[int, int]] = []
        self._at = 0

    def _level(self, key: int, node) -> tuple[list, list, list[ast.stmt]]:
        """The statements nested directly in ``node`` (a statement, its
        ``id`` the ``key``; the body for key 0), made once."""
        level = self._levels.get(key)
        if level is None:
            if key != 0 and _block_fields(type(node)) == _SIMPLE:
                self._levels[key] = _NO_LEVEL
                return _NO_LEVEL
            stmts = node if key == 0 else [st for block in _child_blocks(node) for st in block]
            if not stmts:  # (a simple statement: the one empty level, shared)
                level = _NO_LEVEL
            else:
                stmts = sorted(stmts, key=_start)
                level = ([_start(st) for st in stmts], [_span(st) for st in stmts], stmts)
            self._levels[key] = level
        return level

    def lookup(self, pos: Position) -> ast.stmt | None:
        line, end_line, col, end_col = pos
        if line is None:
            return None
        last = self._last
        if last is not None and col is not None and end_col is not None \
                and end_line is not None and _contains(last[0], pos):
            return last[1]
        found = self._bisect(pos, line, col, end_col)
        if found is not None and not self._level(id(found), found)[2]:  # (a simple one)
            self._last = (_span(found), found)
        return found

    def locate(self, pos: Position) -> tuple | None:
        """``lookup(pos)`` and where that statement's own part is
        (``own_span``): ``(statement, line, column, end line, end column)``,
        or None.  The simple statements are tried in source order first,
        from the one found last (a walk along a code object's instructions
        meets them in that order): no bisection for most statements."""
        if None not in pos:
            seq = self._simple
            if seq is None:
                seq = self._simple = sorted(
                    ((_span(st), st) for st in _simple_statements(self.body)),
                    key=lambda item: item[0][:2])
                self._simple_starts = [span[:2] for span, _ in seq]
            line, end_line, col, end_col = cast("tuple[int, int, int, int]", pos)
            for k in (self._at, self._at + 1):
                if k < len(seq):
                    (s_line, s_col, e_line, e_col), stmt = seq[k]
                    if (s_line < line or s_line == line and s_col <= col) \
                            and (end_line < e_line or end_line == e_line and end_col <= e_col):
                        self._at = k
                        return (stmt, s_line, s_col, e_line, e_col)
        found = self.lookup(pos)
        if found is None:
            return None
        own = self.own_span(found)
        if self._simple is not None and self._last is not None and self._last[1] is found:
            # (a simple one: the walk goes on from it)
            self._at = max(0, bisect.bisect_right(self._simple_starts, own[:2]) - 1)
        return (found, *own)

    def own_span(self, stmt: ast.stmt) -> tuple[int, int, int, int]:
        """Where ``stmt`` starts, and where the part of it that is its own
        ends: its end (a simple statement), or its first nested statement's
        start (a compound one: its header)."""
        start, end = _start(stmt), (stmt.end_lineno, stmt.end_col_offset)
        nested = self._level(id(stmt), stmt)[0]
        return (*start, *(nested[0] if nested else end))

    def lookup_all(self, locations) -> list:
        """``lookup`` of each of ``locations`` (objects with ``lineno``,
        ``end_lineno``, ``col_offset`` and ``end_col_offset``, or None: no
        statement), a location that is the same object as the one before it
        looked up once: a code object's instructions, in one pass (the
        rewrite's part per instruction that cost most, as calls)."""
        out: list = []
        append = out.append
        last_loc: object = None
        stmt = None
        # the last simple statement found (``_last``), unpacked
        s_line = s_col = e_line = e_col = -1
        last_stmt = None
        if self._last is not None:
            (s_line, s_col, e_line, e_col), last_stmt = self._last
        for loc in locations:
            if loc is not last_loc:
                last_loc = loc
                if loc is None:
                    stmt = None
                else:
                    line, end_line = loc.lineno, loc.end_lineno
                    col, end_col = loc.col_offset, loc.end_col_offset
                    if last_stmt is not None and line is not None and col is not None \
                            and end_col is not None and end_line is not None \
                            and (s_line < line or s_line == line and s_col <= col) \
                            and (end_line < e_line or end_line == e_line and end_col <= e_col):
                        stmt = last_stmt  # (``_contains``, written out)
                    else:
                        stmt = self.lookup((line, end_line, col, end_col))
                        if self._last is not None and self._last[1] is not last_stmt:
                            (s_line, s_col, e_line, e_col), last_stmt = self._last
            append(stmt)
        return out

    def _bisect(self, pos: Position, line: int, col: int | None,
                end_col: int | None) -> ast.stmt | None:
        found: ast.stmt | None = None
        starts, spans, stmts = self._level(0, self.body)
        while stmts:
            if col is None or end_col is None:
                i = bisect.bisect_right(starts, (line, float("inf"))) - 1
                while i > 0 and _contains(spans[i - 1], pos):
                    i -= 1  # several statements on the line: the first (as a scan would)
            else:
                i = bisect.bisect_right(starts, (line, col)) - 1
            if i < 0 or not _contains(spans[i], pos):
                return found
            found = stmts[i]
            starts, spans, stmts = self._level(id(found), found)
        return found


def _simple_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of ``body`` and those nested in them (not in a nested
    scope) that have none nested in them."""
    stack = list(body)
    while stack:
        node = stack.pop()
        if _block_fields(type(node)) == _SIMPLE:
            yield node
        else:
            stack.extend(st for block in _child_blocks(node) for st in block)


def _in_block(stmt: ast.stmt, block: list[ast.stmt]) -> bool:
    span = _span(stmt)
    return any(_span(s)[:2] <= span[:2] and span[2:] <= _span(s)[2:] for s in block)


def has_loop(scope: ast.AST) -> bool:
    """True if the scope's own code (not nested functions/classes) has a loop."""
    body = scope.body if hasattr(scope, "body") else []
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, _LOOPS):
            return True
        if isinstance(node, _SCOPES):
            continue
        stack.extend(s for b in _child_blocks(node) for s in b)
    return False


def _always_reraises(handler: ast.ExceptHandler) -> bool:
    """Every path through the handler body ends in ``raise`` of the same
    exception (a bare ``raise``, or ``raise <the as-name>`` never rebound), and
    nothing before it raises something else or leaves the block."""
    body = handler.body
    if not body:
        return False
    last = body[-1]
    if not isinstance(last, ast.Raise) or last.cause is not None:
        return False
    if last.exc is not None:
        if not (isinstance(last.exc, ast.Name) and handler.name and last.exc.id == handler.name):
            return False
        if _rebinds(body[:-1], handler.name):
            return False
    return not _leaves_block(body[:-1]) and not _raises(body[:-1])


def _scope_walk(stmts: list[ast.stmt]) -> Iterator[ast.AST]:
    """All nodes of the statements, not descending into nested scopes."""
    todo: list[ast.AST] = list(stmts)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, _SCOPES):
            continue
        todo.extend(ast.iter_child_nodes(node))


def _rebinds(stmts: list[ast.stmt], name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, (ast.Store, ast.Del))
               or isinstance(n, ast.ExceptHandler) and n.name == name
               for n in _scope_walk(stmts))


def _raises(stmts: list[ast.stmt]) -> bool:
    return any(isinstance(n, ast.Raise) for n in _scope_walk(stmts))


def _leaves_block(stmts: list[ast.stmt], in_loop: bool = False) -> bool:
    """Does any statement transfer control out of the block other than by raising?"""
    for stmt in stmts:
        if isinstance(stmt, ast.Return):
            return True
        if isinstance(stmt, (ast.Break, ast.Continue)) and not in_loop:
            return True
        if isinstance(stmt, _SCOPES):
            continue
        nested_loop = in_loop or isinstance(stmt, _LOOPS)
        for block in _child_blocks(stmt):
            if _leaves_block(block, nested_loop):
                return True
    return False


@lru_cache(maxsize=1)
def _piece_start():
    """Where a piece of a long source may begin: a line at column 0 that is
    not blank, a comment, a closing bracket or a clause of the statement
    before."""
    import re  # lazy: 0.0 ms

    return re.compile(r"^(?![ \t\f\n#)\]}]|else\b|elif\b|except\b|finally\b)", re.M)


def parse(source: str, filename: str, lines: int = 256) -> ast.Module:
    """``ast.parse(source, filename)``, a long source parsed in pieces of
    about ``lines`` lines, each cut before a line that starts a statement at
    column 0: the parser's own tree of a piece is freed before the next one
    is parsed, where ``ast.parse`` holds the whole module's twice at its
    end (its C tree and the Python one: ~7 + ~12 MB for 3000 statements).
    A cut inside a statement (a string, brackets, a continued line, an
    ``else``) leaves a piece that does not parse: the whole source is
    parsed then.  Each piece is parsed after as many empty lines as come
    before it, so that its positions are the source's."""
    if "\r" in source:  # (a line break the pieces would not count)
        return ast.parse(source, filename)
    pieces = []
    cut, cut_line, line, last = 0, 1, 1, 0
    count = source.count
    for found in _piece_start().finditer(source, 1):
        at = found.start()
        line += count("\n", last, at)
        last = at
        if line - cut_line >= lines:
            pieces.append((cut_line, source[cut:at]))
            cut, cut_line = at, line
    if not pieces:
        return ast.parse(source, filename)
    pieces.append((cut_line, source[cut:]))
    body: list[ast.stmt] = []
    for first, text in pieces:
        try:
            tree = ast.parse("\n" * (first - 1) + text, filename)
        except SyntaxError:
            return ast.parse(source, filename)
        body += tree.body
    tree.body = body
    return tree


class ModuleSource:
    """A parsed source file with the lookups the rewrite and the engine need."""

    def __init__(self, source: str, filename: str, tree: ast.Module | None = None):
        self.source = source
        self.filename = filename
        self.tree = tree if tree is not None else ast.parse(source, filename)
        self._scopes: dict[tuple[str, int], ast.AST] = {}
        self._walk_scope(self.tree.body, "")
        # the statement index (parents, handlers, finally blocks) is built when
        # the rewrite first needs it: a module of first-call stubs never does
        self._indexed = False

    @cached_property
    def _raw(self) -> list[bytes]:
        """The source's lines as bytes: the tokenizer's line breaks only
        (``str.splitlines`` also splits on form feeds and U+2028, which would
        shift every line after them).  Made when a report first shows one."""
        return self.source.encode("utf-8", "surrogatepass").splitlines(True)

    @cached_property
    def lines(self) -> list[str]:
        return [line.decode("utf-8", "surrogatepass").rstrip("\r\n") for line in self._raw]

    def _index(self) -> None:
        # built aside and published at once: two threads' first calls may both
        # build it, neither sees a half-built one
        handlers: dict[tuple[int, int, int, int], ast.ExceptHandler] = {}
        finals: dict[int, ast.Try | ast.TryStar] = {}
        parent: dict[int, ast.AST] = {}
        tree = self.tree
        for child in tree.body:
            parent[id(child)] = tree
        # statements only (no statement is inside an expression): into every
        # block and every scope's body (a scope's own statements have no parent)
        stack: list[ast.stmt] = list(tree.body)
        while stack:
            node = stack.pop()
            if isinstance(node, _SCOPES):
                stack.extend(node.body)
                continue
            for block in _child_blocks(node):
                for child in block:
                    parent[id(child)] = node
                stack.extend(block)
            if isinstance(node, (ast.Try, ast.TryStar)):
                for handler in node.handlers:
                    handlers[_span(handler)] = handler
                if node.finalbody:
                    finals[node.finalbody[0].lineno] = node
        self._handlers, self._finally, self._parent = handlers, finals, parent
        self._indexed = True

    # -- scopes -------------------------------------------------------------

    def _walk_scope(self, body: list[ast.stmt], prefix: str) -> None:
        stack: list[ast.stmt] = list(body)
        while stack:
            node = stack.pop()
            if isinstance(node, (*_FUNC, ast.ClassDef)):
                qual = prefix + node.name
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                self._scopes[(qual, first)] = node
                inner = qual + (".<locals>." if isinstance(node, _FUNC) else ".")
                self._walk_scope(node.body, inner)
                continue
            stack.extend(s for b in _child_blocks(node) for s in b)

    def scope_for(self, code: types.CodeType) -> ast.AST | None:
        """The AST node a code object was compiled from (module, def or class)."""
        if code.co_name == "<module>":
            return self.tree
        return self._scopes.get((code.co_qualname, code.co_firstlineno))

    def scopes(self) -> dict[tuple[str, int], ast.AST]:
        return dict(self._scopes)

    # -- statements ---------------------------------------------------------

    def statements(self, scope: ast.AST) -> StatementIndex:
        return StatementIndex(scope.body)  # type: ignore[attr-defined]

    def enclosing_loop(self, stmt: ast.stmt) -> ast.stmt | None:
        """The innermost loop around ``stmt`` in the same scope, if any."""
        if not self._indexed:
            self._index()
        node = self._parent.get(id(stmt))
        while node is not None and not isinstance(node, (ast.Module, *_SCOPES)):
            if isinstance(node, _LOOPS):
                # a statement in the loop's `else:` is not inside the loop
                if isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and _in_block(
                    stmt, node.orelse
                ):
                    return None
                return node
            node = self._parent.get(id(node))
        return None

    def cases(self, stmt: ast.stmt) -> tuple[tuple[tuple, str, int], ...]:
        """For a ``match`` statement: (spans of pattern and guard, ``case ...:``
        text, line) per case."""
        out = []
        for case in getattr(stmt, "cases", ()):
            parts = [case.pattern] + ([case.guard] if case.guard is not None else [])
            text = "case " + (self.segment(case.pattern) or "?")
            if case.guard is not None:
                text += " if " + (self.segment(case.guard) or "?")
            out.append((tuple(_span(p) for p in parts), text + ":", case.pattern.lineno))
        return tuple(out)

    def text(self, stmt: ast.stmt) -> str:
        """Source text of a simple statement (all of its lines), or the header
        of a compound one."""
        if isinstance(stmt, ast.Match):
            return "match " + (self.segment(stmt.subject) or "?") + ":"
        body = getattr(stmt, "body", None)
        if isinstance(stmt, _SCOPES) or not body or not isinstance(body, list):
            seg = self.segment(stmt)
            if seg is None:
                seg = self.line(stmt.lineno)
            decorated = _start(stmt)[0]  # (the decorators run as part of it)
            if decorated < stmt.lineno:
                seg = "\n".join([*(self.line(n) for n in range(decorated, stmt.lineno)), seg])
            return seg
        # compound statement: its header line(s), up to the first body statement
        first = body[0]
        lines = self.lines[stmt.lineno - 1 : first.lineno - 1] or [self.line(stmt.lineno)]
        header = " ".join(_without_comment(x).strip() for x in lines).strip()
        if first.lineno == stmt.lineno:  # `for x in y: body` on one line
            header = self.line(stmt.lineno)[stmt.col_offset : first.col_offset].strip()
        return header

    def segment(self, node: ast.AST) -> str | None:
        """``ast.get_source_segment`` without re-splitting the file each call
        (column offsets are UTF-8 byte offsets)."""
        try:
            first, last = node.lineno - 1, node.end_lineno - 1  # type: ignore[attr-defined]
            col, end_col = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
        except AttributeError:
            return None
        raw = self._raw
        if not (0 <= first <= last < len(raw)):
            return None
        if first == last:
            return raw[first][col:end_col].decode(errors="replace")
        parts = [raw[first][col:], *raw[first + 1 : last], raw[last][:end_col]]
        return b"".join(parts).decode(errors="replace")

    def line(self, lineno: int | None) -> str:
        if lineno is None or not 0 < lineno <= len(self.lines):
            return ""
        return self.lines[lineno - 1].strip()

    # -- handlers -------------------------------------------------------------

    def handler_at(self, span: Position) -> ast.ExceptHandler | None:
        if None in span:
            return None
        line, end_line, col, end_col = span
        if not self._indexed:
            self._index()
        return self._handlers.get((line, col, end_line, end_col))  # type: ignore[arg-type]

    def clause_reraises(self, span: Position) -> bool:
        handler = self.handler_at(span)
        return handler is not None and _always_reraises(handler)

    def finally_swallows(self, first_body_line: int | None) -> bool:
        if not self._indexed:
            self._index()
        node = self._finally.get(first_body_line) if first_body_line else None
        return node is not None and _leaves_block(node.finalbody)


def is_marked(scope: ast.AST) -> bool:
    """Decorated with ``@daifu.vaccinate`` / ``@vaccinate``."""
    for dec in getattr(scope, "decorator_list", ()):
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Attribute) and target.attr == "vaccinate":
            return True
        if isinstance(target, ast.Name) and target.id == "vaccinate":
            return True
    return False


@lru_cache(maxsize=256)
def _cached(filename: str, source: str) -> ModuleSource | None:
    try:
        return ModuleSource(source, filename)
    except (SyntaxError, ValueError):
        return None


def _without_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` inside a string stays)."""
    if "#" not in line:
        return line
    quote: str | None = None
    i = 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\":
                i += 1
            elif line.startswith(quote, i):
                i += len(quote) - 1
                quote = None
        elif c in "'\"":
            triple = line[i:i + 3]
            quote = triple if triple in ("'" * 3, '"' * 3) else c
            i += len(quote) - 1
        elif c == "#":
            return line[:i].rstrip()
        i += 1
    return line


def source_for_file(filename: str) -> ModuleSource | None:
    """Parse a file through ``linecache`` (cached); ``None`` if unavailable."""
    import linecache  # lazy: 1.5 ms

    lines = linecache.getlines(filename)
    if not lines:
        return None
    return _cached(filename, "".join(lines))


# -- mapping a statement into edited source ------------------------------------------


def _blocks(node: ast.AST) -> list[tuple[str, int, list[ast.stmt]]]:
    out = []
    for name in ("body", "orelse", "finalbody"):
        block = getattr(node, name, None)
        if isinstance(block, list) and block:
            out.append((name, 0, block))
    for n, handler in enumerate(getattr(node, "handlers", ()) or ()):
        out.append(("handlers", n, handler.body))
    for n, case in enumerate(getattr(node, "cases", ()) or ()):
        out.append(("cases", n, case.body))
    return out


def _path_to(scope: ast.AST, target: ast.stmt) -> list[tuple[str, int, int]] | None:
    """(block name, block index, statement index) steps from ``scope`` to ``target``."""
    for name, bidx, block in _blocks(scope):
        for i, stmt in enumerate(block):
            if stmt is target:
                return [(name, bidx, i)]
            if isinstance(stmt, _SCOPES):
                continue
            sub = _path_to(stmt, target)
            if sub is not None:
                return [(name, bidx, i), *sub]
    return None


def _block(node: ast.AST, name: str, bidx: int) -> list[ast.stmt] | None:
    for n, b, block in _blocks(node):
        if n == name and b == bidx:
            return block
    return None


def _key(msrc: ModuleSource, stmt: ast.stmt) -> str:
    if getattr(stmt, "body", None) and not isinstance(stmt, _SCOPES):
        # a compound statement by its text, indentation left out: moving it
        # into a new ``try`` or ``if`` re-indents it, and it is still the same
        text = "\n".join(line.strip() for line in msrc.text(stmt).splitlines())
        return type(stmt).__name__ + ":" + text
    return ast.dump(stmt)


#: statements that can newly enclose the running one: entering their ``body``
#: (or ``else``) leaves nothing on the value stack, so a continuation can
#: start inside them
_WRAPPERS = (ast.Try, ast.TryStar, ast.If)


def _align(old: ModuleSource, block_old: list[ast.stmt], i: int, new: ModuleSource,
           block_new: list[ast.stmt], last: bool) -> tuple[int, bool] | None:
    """Where statement ``i`` of ``block_old`` is in ``block_new``: (index,
    exact) -- exact when it is there unchanged or edited one for one; None
    when it has no counterpart."""
    import difflib  # lazy: 1.0 ms

    keys_old = [_key(old, s) for s in block_old]
    keys_new = [_key(new, s) for s in block_new]
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, keys_old, keys_new,
                                                       autojunk=False).get_opcodes():
        if tag == "insert" and i1 == i and last:
            return j1, False  # lines added right before the failing statement run first
        if i1 <= i < i2:
            if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
                return j1 + (i - i1), True
            if tag in ("replace", "delete") and j1 < len(block_new):
                return j1, False  # an edited statement maps to the start of its replacement
            return None
    return None


def _inside(old: ModuleSource, block_old: list[ast.stmt], i: int, new: ModuleSource,
            wrapper: ast.stmt, last: bool) -> tuple[ast.stmt, bool, int] | None:
    """Statement ``i`` of ``block_old`` found in a block of ``wrapper`` (a new
    ``try`` / ``if`` / ``else`` around it): (statement, exact, index in its
    block), the exact match preferred; None if it is in none of them."""
    found = []
    for name in ("body", "orelse"):
        block = getattr(wrapper, name, None) or []
        hit = _align(old, block_old, i, new, block, last) if block else None
        if hit is not None:
            found.append((block[hit[0]], hit[1], hit[0]))
    exact = [f for f in found if f[1]]
    return (exact or found)[0] if found else None


def map_statement(old: ModuleSource, old_scope: ast.AST, stmt: ast.stmt,
                  new: ModuleSource, new_scope: ast.AST) -> ast.stmt | str:
    """The statement of the edited scope that corresponds to ``stmt``, or a
    reason why there is none.  Enclosing statements must keep their kind
    (their stack state is carried over); inside a block, statements are aligned
    by content, and an edited statement maps to the start of its replacement.

    A new ``try``, ``if`` or ``else`` block around the failing statement or
    around a statement enclosing it (the natural fix for bad data: wrap it in
    ``try``/``except``) holds no stack state: the mapping continues inside it.
    Only the failing statement's own new ``if`` runs its condition (when the
    statement is first in its block): the continuation then starts at the
    ``if``, as the new code would reach the failing statement."""
    path = _path_to(old_scope, stmt)
    if not path:
        return "the failing statement was not found in the old source"
    node_old, node_new = old_scope, new_scope
    for depth, (name, bidx, i) in enumerate(path):
        last = depth == len(path) - 1
        block_old, block_new = _block(node_old, name, bidx), _block(node_new, name, bidx)
        if block_new is None:
            lineno = cast(ast.stmt, node_new).lineno  # a def, a class or a statement
            return f"line {lineno}: the block holding the failing statement is gone"
        assert block_old is not None  # ``path`` was found through these blocks
        hit = _align(old, block_old, i, new, block_new, last)
        if hit is None or hit[0] >= len(block_new):
            return "the failing statement has no counterpart in the new source"
        node_old, node_new = block_old[i], block_new[hit[0]]
        while isinstance(node_new, _WRAPPERS) and type(node_new) is not type(node_old):
            inner = _inside(old, block_old, i, new, node_new, last)
            if inner is None:
                break  # new code in place of the statement: it starts there
            if last and isinstance(node_new, ast.If) and inner[2] == 0:
                break  # a new condition in front of the failing statement: it runs
            node_new = inner[0]
        if node_old is not stmt and type(node_old) is not type(node_new):
            return (f"line {node_new.lineno}: the statement enclosing the failing one changed "
                    f"from {type(node_old).__name__} to {type(node_new).__name__}")
    result = cast(ast.stmt, node_new)  # ``path`` is not empty: a statement of a block
    while isinstance(result, (ast.Try, ast.TryStar)) and type(result) is not type(stmt):
        result = result.body[0]  # a ``try`` has no code of its own: its body's first
    return result


#: the role of the first cell of a statement of each kind (the backends' roles)
_ENTRY_ROLES = {"For": "loop-init", "While": "condition", "If": "condition",
                "With": "with-enter", "Match": "match", "Return": "return", "Raise": "raise"}


def entry_role(stmt: ast.stmt) -> str:
    """The role of the cell a statement starts with (a continuation entering
    the new code at a statement of another kind than the failing one starts
    there)."""
    return _ENTRY_ROLES.get(type(stmt).__name__, "statement")
