"""Figures over interleaved rounds, for the training benchmarks: each figure is taken within a round (against that
round's single process and ceiling, which ran under the same load), then summarized as the median and the worst
round, with the best and every round's own value beside them."""


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def spread(values):
    return {"median": median(values), "worst": min(values), "best": max(values), "rounds": list(values)}


def per_round(rounds):
    """[{kind: img/s}] in round order, from records holding "round", "kind" and "img_per_s"."""
    by_round = {}
    for x in rounds:
        by_round.setdefault(x["round"], {})[x["kind"]] = x["img_per_s"]
    return [by_round[r] for r in sorted(by_round)]


def summarize(rounds, kinds, single="single", ceiling="independent"):
    """Per configuration: img/s, scaling efficiency (against twice the single process of the same round) and the
    share of the ceiling (the independent processes of the same round), each as spread()."""
    table = per_round(rounds)
    summary = {}
    for kind in kinds:
        present = [r for r in table if kind in r]
        summary[kind] = {"img_per_s": spread([r[kind] for r in present])}
        if kind != single:
            summary[kind]["efficiency"] = spread([r[kind] / (2 * r[single]) for r in present])
        if kind not in (single, ceiling):
            summary[kind]["of_ceiling"] = spread([r[kind] / r[ceiling] for r in present])
    return summary


def ratio_by_round(rounds, numerator, denominator):
    """numerator's img/s over denominator's, in each round that ran both, as spread()."""
    return spread([r[numerator] / r[denominator] for r in per_round(rounds) if numerator in r and denominator in r])
