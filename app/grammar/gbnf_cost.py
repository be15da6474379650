"""What a grammar read by `gbnf_reader` costs llama.cpp once built, computed on its compact model.

llama.cpp keeps a grammar's state as a set of parse stacks: one per way the text so far can go on,
each ending at a terminal. Every sampled token checks every stack against the whole vocabulary, and
every character a stack takes is followed by an `advance` that expands rule references until each new
stack ends at a terminal (llama_grammar_advance_stack). So the number of stacks one step can produce
bounds the per-token work, and the number of them that can take the same character bounds how many
ways a token is followed through at once. Nullable items under a repetition multiply both:
`("a"?){0,n}` starts n stacks that all take "a"; nested, they grow as the product of the bounds.

Computed here, over the rules llama.cpp would build (repetitions kept symbolic, so linear time):
- `left_recursion`: a rule that reaches itself before reading a character, with something after the
  call, makes the advance loop forever (llama.cpp's own check only sees rules with an empty
  alternate written out); llama.cpp's check itself revisits shared rules (exponential time on a
  small grammar), so its work is counted too;
- `stacks` / `ambiguity`: the most stacks one step can produce, and the most of them that move in
  step, over the start and the step after every terminal: those whose terminals read one character
  and can take the same one, or that stand at the same literal (stacks at different literals part
  within them: a JSON enum's values all start with `"`, and cost one stack each);
- `growth`: a rule that calls itself with a continuation that may be empty leaves one more such
  continuation on the stack per call, so the stacks grow with the reply: refused.

All counts are upper bounds (paths, not llama.cpp's deduplicated stacks), saturating at `BIG`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .gbnf_reader import Grammar, Item, Node, Ranges, Ref, Term

BIG = 1 << 40
MAX_STEPS = 64  # breakpoints kept per profile; past it neighbours merge upwards (still an upper bound)


class GBNFCostError(ValueError):
    """`kind` is left_recursion or growth; `node`/`pos` say where."""

    def __init__(self, kind: str, pos: int, node: Node | None = None, **facts: int) -> None:
        super().__init__(kind)
        self.kind, self.pos, self.node, self.facts = kind, pos, node, facts


class Stacks:
    """Stacks one step produces: `count` in all (token and empty stacks included) and, as a step
    function over `Term.chars` keys, how many of them take each; `widest`: the most at one key."""

    __slots__ = ("count", "steps", "widest")

    def __init__(self, count: int, steps: tuple[tuple[int, int], ...], widest: int = 0) -> None:
        self.count = count
        self.steps = steps  # ((start, stacks taking keys from start to the next start), ...)
        self.widest = widest

    def __add__(self, other: Stacks) -> Stacks:
        if not other.count:
            return self
        if not self.count:
            return other
        return Stacks(min(self.count + other.count, BIG), *_combine(self.steps, other.steps, True))

    def times(self, k: int) -> Stacks:
        if k == 1 or not self.count:
            return self
        return Stacks(min(self.count * k, BIG), tuple((x, min(n * k, BIG)) for x, n in self.steps),
                      min(self.widest * k, BIG))

    def most(self, other: Stacks) -> Stacks:
        if other is self or not other.count:
            return self
        if not self.count:
            return other
        return Stacks(max(self.count, other.count), *_combine(self.steps, other.steps, False))


def _combine(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...],
             add: bool) -> tuple[tuple[tuple[int, int], ...], int]:
    """The sum (or the pointwise maximum) of two step functions, and its largest value."""
    if not a or not b:
        steps = a or b
        return steps, max((n for _, n in steps), default=0)
    out: list[tuple[int, int]] = []
    i = j = va = vb = top = 0
    na, nb = len(a), len(b)
    while i < na or j < nb:
        xa = a[i][0] if i < na else -1
        xb = b[j][0] if j < nb else -1
        if xb < 0 or 0 <= xa <= xb:
            x, va = a[i]
            i += 1
            if xb == x:
                vb = b[j][1]
                j += 1
        else:
            x, vb = b[j]
            j += 1
        v = min(va + vb, BIG) if add else (va if va > vb else vb)
        if v > top:
            top = v
        if not out or out[-1][1] != v:
            out.append((x, v))
    if len(out) > MAX_STEPS:
        out = _coarsen(out)
    return tuple(out), top


def _coarsen(steps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Half the breakpoints: each pair of neighbouring intervals takes the larger count."""
    merged = [(steps[k][0], max(n for _, n in steps[k:k + 2])) for k in range(0, len(steps) - 1, 2)]
    if len(steps) % 2:
        merged.append(steps[-1])
    out: list[tuple[int, int]] = []
    for x, n in merged:
        if not out or out[-1][1] != n:
            out.append((x, n))
    return out


ZERO = Stacks(0, ())
EMPTY_STACK = Stacks(1, ())  # the stack of a finished parse: it takes no character


def _chars(ranges: Ranges) -> Stacks:
    points: dict[int, int] = {}
    for lo, hi in ranges:
        points[lo] = points.get(lo, 0) + 1
        points[hi + 1] = points.get(hi + 1, 0) - 1
    steps, v = [], 0
    for x in sorted(points):
        v += points[x]
        if not steps or steps[-1][1] != min(v, 1):
            steps.append((x, min(v, 1)))
    return Stacks(1, tuple(steps), 1 if steps else 0)


def _sccs(n: int, adj: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Tarjan's strongly connected components, without recursion: (component of each vertex,
    components in the order found: every component after all those it reaches)."""
    index = [-1] * n
    low = [0] * n
    comp = [-1] * n
    on_stack = [False] * n
    stack: list[int] = []
    comps: list[list[int]] = []
    counter = 0
    for start in range(n):
        if index[start] >= 0:
            continue
        work = [(start, 0)]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack[start] = True
        while work:
            v, i = work[-1]
            if i < len(adj[v]):
                work[-1] = (v, i + 1)
                w = adj[v][i]
                if index[w] < 0:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack[w] = True
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                members = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp[w] = len(comps)
                    members.append(w)
                    if w == v:
                        break
                comps.append(members)
    return comp, comps


@dataclass
class Cost:
    check_work: int  # rule elements llama.cpp's left-recursion check visits
    stacks: int = 0  # most stacks one step produces (0: not computed)
    ambiguity: int = 0  # most of them that take one character (see step_costs)
    stacks_at: int = -1  # text position of the terminal that step follows (-1: the start)
    ambiguity_at: int = -1
    entering: bool = False  # stacks counted on entering each rule only: `stacks_at` is that rule's


@dataclass
class _End:
    """What follows the last item of a node's alternate: stacks it starts, whether it may be
    empty, and whether nothing at all follows in llama.cpp's rule (no frame is pushed)."""

    stacks: Stacks
    nullable: bool
    tail: bool


_TAIL = _End(ZERO, True, True)


class _Analysis:
    def __init__(self, g: Grammar) -> None:
        self.g = g
        self.nodes = g.nodes
        n = len(g.nodes)
        self.null = [False] * n
        self.T: list[Stacks] = [ZERO] * n  # stacks produced on entering a node
        self.F: list[Stacks] = [ZERO] * n  # ... by its first alternate alone (copies, chains: one copy)
        self.term_stacks: dict[Ranges | None, Stacks] = {}

    # -- nullable nodes: a least fixpoint, linear (a counter of open items per alternate) ---------
    def find_nullable(self) -> None:
        null = self.null
        waiting: list[list[tuple[int, int]]] = [[] for _ in self.nodes]
        counts: list[list[int]] = []
        work: list[int] = []
        for node in self.nodes:
            x = node.index
            alt_counts = []
            for a, alt in enumerate(node.alts):
                if any(type(item) is Term for item in alt):
                    alt_counts.append(-1)
                    continue
                alt_counts.append(len(alt))
                for item in alt:
                    waiting[item.node.index].append((x, a))
            counts.append(alt_counts)
            if node.kind == "chain" or 0 in alt_counts:
                null[x] = True
                work.append(x)
        while work:
            done = work.pop()
            for x, a in waiting[done]:
                if null[x]:
                    continue
                counts[x][a] -= 1
                if counts[x][a] == 0:
                    null[x] = True
                    work.append(x)

    def nullable(self, item: Item) -> bool:
        return type(item) is Ref and self.null[item.node.index]

    def terminal(self, item: Term) -> Stacks:
        found = self.term_stacks.get(item.chars)
        if found is None:
            found = self.term_stacks[item.chars] = EMPTY_STACK if item.chars is None else _chars(item.chars)
        return found

    def pushes_at_end(self, node: Node) -> bool:
        """Whether a reference ending one of `node`'s alternates is followed by more in llama.cpp's
        rules (the next copy; the next generated rule), so that calling it pushes a frame."""
        if node.kind == "copies":
            return True
        return node.kind == "chain" and (node.unbounded or node.count > 1)

    # -- left recursion ------------------------------------------------------------------------
    def check_left_recursion(self) -> None:
        """Rules reachable before any character is read: a cycle through them that leaves a frame
        on the stack (something follows the call) makes llama.cpp's advance loop forever."""
        nodes, null = self.nodes, self.null
        adj: list[list[int]] = [[] for _ in nodes]
        push_at: dict[tuple[int, int], int] = {}
        for node in nodes:
            end_pushes = self.pushes_at_end(node)
            for alt in node.alts:
                for i, item in enumerate(alt):
                    if type(item) is Term:
                        break
                    y = item.node.index
                    adj[node.index].append(y)
                    if i + 1 < len(alt) or end_pushes:
                        push_at.setdefault((node.index, y), item.pos)
                    if not null[y]:
                        break
        comp, comps = _sccs(len(nodes), adj)
        self.leftmost, self.leftmost_comps = adj, comps
        for x, ys in enumerate(adj):
            for y in ys:
                if comp[x] == comp[y] and (x, y) in push_at:
                    raise GBNFCostError("left_recursion", push_at[(x, y)], self._named(comps[comp[x]]))

    def _named(self, members: list[int]) -> Node:
        nodes = [self.nodes[m] for m in members]
        return next((n for n in nodes if n.kind == "rule"), nodes[0])

    # -- llama.cpp's left-recursion check (llama_grammar_detect_left_recursion) ------------------
    def check_work(self) -> int:
        """Elements llama.cpp's check visits. It follows each rule's leading references while the
        one before has an alternate written empty, and has no memo inside one search: a rule
        reached along k paths is walked k times. Every rule starts a search here (llama.cpp skips
        rules an earlier search finished), so this is an upper bound."""
        nodes = self.nodes
        empty = [node.kind == "chain" or any(not alt for alt in node.alts) for node in nodes]
        # a run of copies read with the flag set: (references visited, flag after), per copies node
        copies_walk: dict[int, tuple[list[tuple[int, int]], bool]] = {}

        def walk(items: list[Item], flag: bool) -> tuple[list[tuple[int, int]], bool]:
            visits: list[tuple[int, int]] = []
            for item in items:
                if not flag:
                    break
                if type(item) is Term:
                    flag = False
                elif item.node.kind == "copies":
                    inner, after = copies_walk[item.node.index]
                    visits.extend((y, m * (item.node.count if after else 1)) for y, m in inner)
                    flag = after
                else:
                    visits.append((item.node.index, 1))
                    flag = empty[item.node.index]
            return visits, flag

        adj: list[list[int]] = [[] for _ in nodes]
        visits_of: list[list[tuple[int, int]]] = [[] for _ in nodes]
        chained = [False] * len(nodes)
        for node in nodes:  # a copies node comes after those it contains
            if node.kind == "copies":
                copies_walk[node.index] = walk(node.alts[0], True)
        for node in nodes:
            x = node.index
            if node.kind == "copies":
                continue
            for alt in node.alts:
                visits, after = walk(alt, True)
                visits_of[x].extend(visits)
                if node.kind == "chain" and after:
                    chained[x] = True  # the next generated rule is visited too
                    if node.unbounded:  # `x' ::= x x' |` reaches itself: llama.cpp refuses it
                        raise GBNFCostError("left_recursion", node.pos, node)
            adj[x] = [y for y, _ in visits_of[x]]
        _, comps = _sccs(len(nodes), adj)
        for members in comps:
            if len(members) > 1 or members[0] in adj[members[0]]:
                raise GBNFCostError("left_recursion", self.nodes[members[0]].pos, self._named(members))
        one = [0] * len(nodes)  # one search from the node (for a chain: from its first generated rule)
        total = 0
        for members in comps:
            x = members[0]
            node = nodes[x]
            if node.kind == "copies":
                continue
            below = sum(min(m * one[y], BIG) for y, m in visits_of[x])
            if node.kind == "chain":
                a = min(node.elems + 3 + below, BIG)
                n = node.count
                one[x] = min(n * a, BIG) if chained[x] else a
                total += min(a * n * (n + 1) // 2, BIG) if chained[x] else min(n * a, BIG)
            else:
                one[x] = min(node.elems + len(node.alts) + below, BIG)
                total += one[x]
        return min(total, BIG)

    # -- parse stacks ----------------------------------------------------------------------------
    def entry_stacks(self) -> None:
        """T: the stacks entering each node produces (not counting the pass through an empty one);
        F: those of a copies or chain node's one copy."""
        nodes, null = self.nodes, self.null
        for members in self.leftmost_comps:
            inside = set(members) if len(members) > 1 or members[0] in self.leftmost[members[0]] else ()
            total = ZERO
            for x in members:
                node = nodes[x]
                base = ZERO
                for alt in node.alts:
                    for item in alt:
                        if type(item) is Term:
                            base = base + self.terminal(item)
                            break
                        y = item.node.index
                        if y not in inside:
                            base = base + self.T[y]
                        if not null[y]:
                            break
                self.F[x] = base
                if node.kind == "copies" or (node.kind == "chain" and not node.unbounded):
                    # every copy / generated rule starts stacks while the ones before it may be empty
                    if all(self.nullable(item) for item in node.alts[0]):
                        base = base.times(node.count)
                self.T[x] = base
                total = total + base
            if inside:
                for x in members:
                    self.T[x] = total

    def ends(self, node: Node) -> list[_End]:
        """What may follow the end of `node`'s alternate: the next copy or generated rule (their
        stacks), or nothing (the caller's continuation)."""
        if node.kind == "copies":
            one = self.F[node.index]
            nullable = all(self.nullable(i) for i in node.alts[0])
            return [_End(one.times(node.count - 1) if nullable else one, nullable, False), _TAIL]
        if node.kind == "chain":
            one = self.F[node.index]
            if node.unbounded:
                return [_End(one, True, False)]
            if node.count > 1:
                nullable = all(self.nullable(i) for i in node.alts[0])
                return [_End(one.times(node.count - 1) if nullable else one, True, False), _TAIL]
        return [_TAIL]

    def suffixes(self, alt: list[Item]) -> list[tuple[Stacks, bool]]:
        out: list[tuple[Stacks, bool]] = [(ZERO, True)] * (len(alt) + 1)
        for i in range(len(alt) - 1, -1, -1):
            item = alt[i]
            if type(item) is Term:
                out[i] = (self.terminal(item), False)
            else:
                y = item.node.index
                after, after_null = out[i + 1]
                out[i] = (self.T[y] + after, after_null) if self.null[y] else (self.T[y], False)
        return out

    @staticmethod
    def follow(suffix: list[tuple[Stacks, bool]], i: int, end: _End) -> _End:
        """What follows the item at `i` of an alternate, given what follows the alternate."""
        if i + 2 == len(suffix):
            return end
        after, after_null = suffix[i + 1]
        return _End(after + end.stacks if after_null else after, after_null and end.nullable, False)

    def prepare_steps(self) -> None:
        """The reachable nodes, their call sites, and the order endings are computed in (callers
        first). A cycle of calls each followed by something that may be empty, one of them by
        something (a pushed frame), grows the stacks with every repeat: GBNFCostError `growth`."""
        nodes = self.nodes
        order = [self.g.root.index]
        index = {order[0]: 0}
        for x in order:
            for alt in nodes[x].alts:
                for item in alt:
                    if type(item) is Ref and item.node.index not in index:
                        index[item.node.index] = len(order)
                        order.append(item.node.index)
        ends = [self.ends(nodes[x]) for x in order]  # only their shape (nullable, tail) is used here
        adj: list[list[int]] = [[] for _ in order]
        push_at: dict[tuple[int, int], int] = {}
        sites: list[tuple[int, int, int, int]] = []  # (callee, caller, alternate, position)
        for k, x in enumerate(order):
            for a, alt in enumerate(nodes[x].alts):
                nullable_after = True
                for i in range(len(alt) - 1, -1, -1):
                    item = alt[i]
                    if type(item) is Ref:
                        y = index[item.node.index]
                        sites.append((y, k, a, i))
                        for end in ends[k]:
                            tail = i + 1 == len(alt) and end.tail
                            if nullable_after and end.nullable:
                                adj[y].append(k)
                                if not tail:
                                    push_at.setdefault((y, k), item.pos)
                    nullable_after = nullable_after and self.nullable(item)
        comp, comps = _sccs(len(order), adj)
        for y, xs in enumerate(adj):
            for k in xs:
                if comp[k] == comp[y] and (y, k) in push_at:
                    raise GBNFCostError("growth", push_at[(y, k)], self._named([order[m] for m in comps[comp[y]]]))
        self.order, self.sites, self.comps = order, sites, comps

    def level(self) -> tuple[Stacks, list[tuple[Term, Stacks]]]:
        """The stacks at the start, and those after each (reachable) terminal: what follows it in
        its alternate, and when that may be empty, what its rule's callers continue with (U)."""
        nodes, order, null = self.nodes, self.order, self.null
        self.entry_stacks()
        ends = [self.ends(nodes[x]) for x in order]
        suffixes = [[self.suffixes(alt) for alt in nodes[x].alts] for x in order]
        calls: list[list[tuple[int, _End]]] = [[] for _ in order]
        for y, k, a, i in self.sites:
            for end in ends[k]:
                calls[y].append((k, self.follow(suffixes[k][a], i, end)))
        U: list[Stacks] = [ZERO] * len(order)  # stacks produced when a node's parse ends
        for members in self.comps:  # callers come first
            inside = set(members)
            best = EMPTY_STACK if 0 in inside else ZERO  # ending root empties the stack
            for y in members:
                for k, then in calls[y]:
                    if then.nullable and k in inside:
                        continue  # a call without a frame within: the same ending
                    best = best.most(then.stacks + U[k] if then.nullable else then.stacks)
            for y in members:
                U[y] = best
        root = self.g.root.index
        start = self.T[root] + EMPTY_STACK if null[root] else self.T[root]
        after: list[tuple[Term, Stacks]] = []
        for k, x in enumerate(order):
            for alt, suffix in zip(nodes[x].alts, suffixes[k]):
                last = len(alt) - 1
                for i, item in enumerate(alt):
                    if type(item) is not Term:
                        continue
                    if i < last and not suffix[i + 1][1]:  # the next item alone, it cannot be empty
                        after.append((item, suffix[i + 1][0]))
                        continue
                    for end in ends[k]:
                        then = self.follow(suffix, i, end)
                        after.append((item, then.stacks + U[k] if then.nullable else then.stacks))
        return start, after

    def entry_costs(self) -> Cost:
        """The most stacks entering one node produces (counts only: `entry_stacks` without
        the characters)."""
        nodes, null, leftmost = self.nodes, self.null, self.leftmost
        T = [0] * len(nodes)
        for members in self.leftmost_comps:
            inside = set(members) if len(members) > 1 or members[0] in leftmost[members[0]] else ()
            total = 0
            for x in members:
                node = nodes[x]
                base = 0
                for alt in node.alts:
                    for item in alt:
                        if type(item) is Term:
                            base += 1
                            break
                        y = item.node.index
                        if y not in inside:
                            base += T[y]
                        if not null[y]:
                            break
                if node.kind == "copies" or (node.kind == "chain" and not node.unbounded):
                    if all(self.nullable(item) for item in node.alts[0]):
                        base *= node.count
                T[x] = min(base, BIG)
                total = min(total + T[x], BIG)
            if inside:
                for x in members:
                    T[x] = total
        root = self.g.root.index
        most = max(range(len(nodes)), key=T.__getitem__)
        if T[root] + null[root] >= T[most]:
            return Cost(0, T[root] + null[root])
        return Cost(0, T[most], 0, nodes[most].pos, entering=True)

    def step_costs(self) -> Cost:
        """The most stacks one step produces, and the most of them that take one character."""
        self.prepare_steps()
        start, after = self.level()
        cost = Cost(0, start.count, start.widest)
        for term, step in after:
            if step.count > cost.stacks:
                cost.stacks, cost.stacks_at = step.count, term.pos
            if step.widest > cost.ambiguity:
                cost.ambiguity, cost.ambiguity_at = step.widest, term.pos
        return cost


def grammar_cost(g: Grammar, *, steps: bool = True) -> Cost:
    """The costs of `g` (see the module docstring). GBNFCostError for left recursion and for
    stacks that grow with the reply. With `steps` False only the stacks entering each rule are
    counted (a lower bound of `stacks`, in a third of the time; `ambiguity` stays 0)."""
    analysis = _Analysis(g)
    analysis.find_nullable()
    analysis.check_left_recursion()
    cost = analysis.step_costs() if steps else analysis.entry_costs()
    cost.check_work = analysis.check_work()
    return cost
