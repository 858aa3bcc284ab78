"""The report's sections as tables of formatted cells, shared by the text, md and html views."""

from __future__ import annotations

from kvmigrate.render import fmt
from kvmigrate.render.table import Table
from kvmigrate.report.candidate_pairs import FOOTNOTE as PAIRS_FOOTNOTE
from kvmigrate.report.candidate_pairs import HEADERS as PAIR_HEADERS
from kvmigrate.report.candidate_pairs import pair_rows
from kvmigrate.report.candidates import HEADERS as CANDIDATE_HEADERS
from kvmigrate.report.candidates import candidate_rows
from kvmigrate.report.completeness import completeness_lines
from kvmigrate.report.cost import OBSERVED, SET_THROUGHPUT
from kvmigrate.report.evaluate_table import slow_section
from kvmigrate.report.model import BackendSummary, CostProjection, Report
from kvmigrate.report.scorecard_table import scorecard_table
from kvmigrate.report.speed_tables import decode, decode_by_turn, flatness
from kvmigrate.report.users_table import users_section

NOT_SCORED = "Parity: not yet scored (the parity engine has not scored any shadow pair)."


def summary_lines(report: Report) -> list[str]:
    lines = [
        f"Window: {fmt.when(report.since)} .. {fmt.when(report.until)}",
        f"Records: {report.records:,} calls from {report.database or 'no database'}",
        f"Primary: {report.primary}   Candidate: {report.candidate or 'none (observe)'}",
    ]
    return lines + completeness_lines(report.completeness) + list(report.notes)


def report_tables(report: Report) -> list[Table]:
    """The sections of one view: the fleet's (with its by-cohort table) or one cohort's."""
    # Here, not at the top: engine_tables builds its sections from this module's Table.
    from kvmigrate.report.engine_tables import engine_tables

    return [
        *([scorecard_table(report)] if report.scorecard else []),
        headline(report),
        *by_cohort(report),
        coverage(report),
        ttft_by_turn(report),
        flatness(report),
        decode(report),
        decode_by_turn(report),
        cache_by_turn(report),
        identity(report),
        cost(report),
        Table("slow_conversations", *slow_section(report.slow_conversations)),
        *engine_tables(report),
        parity(report),
        Table("users", *users_section(report.users)),
        *by_candidate(report),
        *candidates_against_each_other(report),
        cache_busters(report),
        timeline(report),
    ]


def cohort_lines(report: Report) -> list[str]:
    """What a cohort's view says before its sections."""
    return [
        f"Cohort: {report.cohort} (its traffic alone, {report.records:,} calls)",
        f"Primary: {report.primary}   Candidate: {report.candidate or 'none (observe)'}",
        *report.notes,
    ]


BACKEND_HEADERS = (
    "backend",
    "serve",
    "shadow",
    "conversations",
    "errors",
    "error rate",
    "TTFT p50",
    "TTFT p95",
    "latency p50",
    "latency p95",
    "cache hit",
)


def backend_cells(b: BackendSummary) -> tuple[str, ...]:
    """One backend's row, in the headline and in the by-cohort table alike."""
    return (
        b.backend,
        fmt.number(b.serve),
        fmt.number(b.shadow),
        fmt.number(b.conversations),
        fmt.number(b.errors),
        fmt.pct(b.error_rate),
        fmt.ms(b.ttft_p50_ms),
        fmt.ms(b.ttft_p95_ms),
        fmt.ms(b.latency_p50_ms),
        fmt.ms(b.latency_p95_ms),
        fmt.pct(b.cached_tokens / b.prompt_tokens if b.prompt_tokens else None),
    )


def headline(report: Report) -> Table:
    rows = [backend_cells(b) for b in report.backends]
    foot = ""
    if report.noise_calls:
        foot = (
            f"{report.records:,} records: these {report.records - report.noise_calls:,} calls, "
            f"and {report.noise_calls:,} noise calls (the primary asked a second time, for "
            "the parity noise floor), which count for parity only."
        )
    title = f"Headline: cohort {report.cohort}" if report.cohort else "Headline"
    note = "No calls recorded in this window."
    return Table("headline", title, BACKEND_HEADERS, rows, note, foot)


def by_cohort(report: Report) -> list[Table]:
    """Each cohort's headline in one table, when there is more than one."""
    if not report.cohorts:
        return []
    rows = [(c.cohort, *backend_cells(b)) for c in report.cohorts for b in c.backends]
    foot = (
        "The headline above is the whole fleet; each cohort moves on its own rollout, and "
        "every section below is repeated for each cohort on its own traffic."
    )
    return [Table("cohorts", "By cohort", ("cohort", *BACKEND_HEADERS), rows, "", foot)]


def coverage(report: Report) -> Table:
    c = report.coverage
    rows = []
    if c.primary_requests:
        rows = [
            (
                "requests",
                f"{c.shadowed_requests:,} of {c.primary_requests:,}",
                fmt.pct(c.request_ratio),
            ),
            (
                "conversations",
                f"{c.shadowed_conversations:,} of {c.primary_conversations:,}",
                fmt.pct(c.conversation_ratio),
            ),
        ]
    note = f"No calls served by the primary `{report.primary}` in this window."
    title = f"Shadow coverage (primary calls shadowed to {report.candidate or 'none'})"
    return Table("coverage", title, ("unit", "shadowed", "share"), rows, note)


def identity(report: Report) -> Table:
    i = report.identity
    rows = [(source, fmt.number(n), fmt.pct(n / i.served)) for source, n in i.shares]
    if rows:
        rows.append(("conversations", fmt.number(i.conversations), ""))
        rows.append(("split across backends", fmt.number(i.split), ""))
    note = "No served requests with a recorded identity source in this window."
    title = "Conversation identity (how served requests were keyed)"
    return Table("identity", title, ("source", "requests", "share"), rows, note)


def ttft_by_turn(report: Report) -> Table:
    p, c = report.primary, report.candidate
    headers: tuple[str, ...] = (
        "turn",
        f"{p} n",
        f"{p} p50",
        f"{p} p95",
        f"{c} n",
        f"{c} p50",
        f"{c} p95",
    )
    headers += ("reduction p50", "reduction p95")
    rows = [
        (
            t.turn,
            fmt.number(t.primary_n),
            fmt.ms(t.primary_p50_ms),
            fmt.ms(t.primary_p95_ms),
            fmt.number(t.candidate_n),
            fmt.ms(t.candidate_p50_ms),
            fmt.ms(t.candidate_p95_ms),
            fmt.pct(t.reduction_p50_pct, ratio=False, signed=True),
            fmt.pct(t.reduction_p95_pct, ratio=False, signed=True),
        )
        for t in report.ttft_by_turn
    ]
    title = "TTFT by turn (reduction > 0: the candidate is faster)"
    foot = ""
    if any(fmt.MISSING in row[1:] for row in rows):
        foot = (
            f"{fmt.MISSING}: no streamed call at that turn. TTFT is the time to the first "
            "streamed byte; a non-streamed answer has none (its total latency is in the "
            "headline and the latency CDF)."
        )
    return Table("ttft_by_turn", title, headers, rows, "No timed calls in this window.", foot)


def cache_by_turn(report: Report) -> Table:
    names = [b.backend for b in report.backends]
    rows = [(r.turn, *(fmt.pct(r.hit.get(n)) for n in names)) for r in report.cache_by_turn]
    title = "Prefix cache hit by turn (cached / prompt tokens)"
    return Table("cache_by_turn", title, ("turn", *names), rows, "No token usage recorded.")


def cost(report: Report) -> Table:
    k, p = report.cost, report.cost.prices
    if k.hosted_monthly_usd is None:
        return Table("cost", "Cost projection", (), [], "No successful served calls to price.")
    rows = [
        ("traffic basis", fmt.duration(k.basis_s)),
        ("requests / month", fmt.number(k.monthly_requests)),
        (
            "input tokens / month (of which cached)",
            f"{fmt.number(k.monthly_input_tokens)} ({fmt.number(k.monthly_cached_tokens)})",
        ),
        *_cache_write_rows(k),
        ("output tokens / month", fmt.number(k.monthly_output_tokens)),
        (
            "hosted prices per 1M tokens (input / cached / output)",
            " / ".join(fmt.usd(v) for v in (p.input_per_m, p.cached_input_per_m, p.output_per_m)),
        ),
        ("hosted cost / month", fmt.usd(k.hosted_monthly_usd)),
        ("output demand (tokens/s, average)", fmt.number(k.demand_tokens_per_s, 2)),
        (
            "GPU throughput (output tokens/s per GPU)",
            f"{fmt.number(k.gpu_tokens_per_s, 1)} ({k.throughput_source})",
        ),
        (
            "GPUs needed" + (" (at most)" if k.throughput_source == OBSERVED else ""),
            fmt.number(k.gpus),
        ),
        (
            "self-hosted cost / month",
            f"{fmt.usd(k.self_hosted_monthly_usd)} at {fmt.usd(p.gpu_per_hour)}/GPU-hour",
        ),
        ("monthly savings (hosted - self-hosted)", fmt.usd(k.savings_monthly_usd)),
    ]
    foot = SET_THROUGHPUT if k.throughput_source == OBSERVED else ""
    title = "Cost projection (30 days at the observed traffic)"
    return Table("cost", title, ("item", "value"), rows, footnote=foot)


def _cache_write_rows(k: CostProjection) -> list[tuple[str, str]]:
    """Cache writes get their own row and price only when the traffic has any (Anthropic
    reports them; the OpenAI-style APIs do not)."""
    if not k.monthly_cache_write_tokens:
        return []
    price = fmt.usd(k.prices.cache_write_price)
    return [
        (
            "input tokens / month written to the cache",
            f"{fmt.number(k.monthly_cache_write_tokens)} at {price} per 1M",
        )
    ]


def parity(report: Report) -> Table:
    s = report.parity
    if not s.scored:
        return Table("parity", "Parity", (), [], NOT_SCORED)
    adjusted = (
        f"{fmt.pct(s.noise_adjusted)} (lowest comparator: {s.lowest_comparator})"
        if s.noise_adjusted is not None
        else f"inconclusive ({s.noise_pairs} noise pairs so far)"
    )
    rows = [
        ("scored pairs", fmt.number(s.samples)),
        ("noise-adjusted parity", adjusted),
        ("primary-vs-primary noise pairs", fmt.number(s.noise_pairs)),
        ("mean pair score (raw, before noise)", fmt.pct(s.mean)),
        ("tool-call agreement", fmt.pct(s.tool_agreement)),
        ("JSON validity", fmt.pct(s.json_validity)),
        ("pairs that answered differently", _divergent(report)),
    ]
    rows += [
        (
            f"worst: {d.conversation} turn {d.turn} ({fmt.pct(d.score)})",
            f"{report.candidate}'s answer: {d.excerpt}" if d.excerpt else fmt.MISSING,
        )
        for d in s.worst
    ]
    return Table("parity", "Parity", ("item", "value"), rows, footnote=PARITY_READING)


def _divergent(report: Report) -> str:
    beyond = sum(p.verdict == "diverged" for p in report.divergences)
    held = len(report.divergences)
    shown = "" if held == report.divergent_total else f"the worst {held} shown, "
    return (
        f"{fmt.number(report.divergent_total)} ({shown}{beyond} beyond their noise; side by "
        "side in the HTML report's divergences view)"
    )


def by_candidate(report: Report) -> list[Table]:
    """Each candidate's parity against the primary, side by side, when there are several."""
    if not report.parity_by_candidate:
        return []
    rows = candidate_rows(report.parity_by_candidate)
    foot = "Each against the primary on the same shadowed requests, with the same noise floor."
    return [Table("candidates", "Parity by candidate", CANDIDATE_HEADERS, rows, "", foot)]


def candidates_against_each_other(report: Report) -> list[Table]:
    """Two candidates' answers to the same requests, when a model shadows to several."""
    if not report.candidate_pairs:
        return []
    rows = pair_rows(report.candidate_pairs)
    title = "Candidates against each other"
    return [Table("candidate_pairs", title, PAIR_HEADERS, rows, "", PAIRS_FOOTNOTE)]


PARITY_READING = (
    "A pair's score is the raw agreement of the candidate's answer with the primary's, "
    "both to the same request; the worst pairs list those under 100%. Noise-adjusted parity "
    "counts, per comparator (text, tool calls, ...), disagreements beyond those the primary "
    "shows against itself on the same requests: a low-scoring pair the primary also "
    "disagrees with itself on does not lower it, so 0% pairs and a high figure can both "
    "be true. It covers every pair in this report's window; the parity gate judges the "
    "evidence since the last rollout change, on the comparators with min_parity_samples "
    "pairs, so its lowest comparator and figure can differ from this one."
)


def cache_busters(report: Report) -> Table:
    b = report.cache_busters
    title = "Cache busters (what broke prefix reuse in the recorded prompts)"
    if not b.checked:
        note = (
            "No recorded requests in this window to check."
            if not report.records
            # records without bodies: written under record.content none
            else "No recorded request bodies to check: the requests in this window were "
            "recorded without them (record.content: none)."
        )
        return Table("cache_busters", title, (), [], note)
    rows = [
        (
            x.cls + (" (deliberate)" if x.deliberate else ""),
            x.field,
            fmt.number(x.breaks),
            fmt.number(x.conversations),
            fmt.number(x.tokens_lost),
            x.fix,
        )
        for x in b.busters
    ]
    note = (
        f"None: every one of {b.compared:,} later turns in {b.conversations:,} conversations "
        "reused its whole prefix."
    )
    foot = (
        f"{b.breaks:,} breaks ({b.tokens_lost:,} prompt tokens prefilled again) in "
        f"{b.compared:,} later turns; prefix reuse {fmt.pct(b.reuse_ratio)}. The live "
        "detector counts the same causes in kvmigrate_cache_breaks_total; "
        "`kvmigrate cachecheck --dataset` on `report --export-requests` gives every example."
    )
    headers = ("cause", "where", "breaks", "conversations", "tokens lost", "fix")
    return Table("cache_busters", title, headers, rows, note, foot if rows else "")


def timeline(report: Report) -> Table:
    rows = [
        (fmt.when(e.ts), e.kind, fmt.pct(e.percent, ratio=False), e.detail) for e in report.timeline
    ]
    note = "No rollout events in this window."
    return Table(
        "timeline", "Rollout timeline", ("time", "event", "candidate %", "detail"), rows, note
    )
