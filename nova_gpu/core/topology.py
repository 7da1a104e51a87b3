"""How well a set of GPUs is connected, and which sets to consider."""

# Penalties, lower is better: the cost of talking across each boundary.
NVLINK = 0.0
PCIE_SWITCH = 0.5
NUMA_NODE = 1.0
CROSS_NUMA = 2.0


def nvlink_connected(gpus):
    """Every pair of ``gpus`` shares an NVLink (or NVSwitch) connection."""
    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
            if b.index not in a.nvlink_peers:
                return False
    return True


def same_numa(gpus):
    return len({g.numa_node for g in gpus}) == 1


def penalty(gpus):
    """Topology penalty of a GPU set: 0 for one GPU or an NVLink clique."""
    if len(gpus) < 2:
        return NVLINK
    numa_nodes = len({g.numa_node for g in gpus})
    switches = len({g.pcie_switch for g in gpus})
    # Within a class, fewer NUMA nodes and switches spanned is better
    # still: host memory traffic and peer-to-peer over PCIe stay local.
    spread = 0.1 * (numa_nodes - 1) + 0.05 * (switches - 1)
    if nvlink_connected(gpus):
        return NVLINK + spread
    if gpus[0].pcie_switch is not None and switches == 1:
        return PCIE_SWITCH + spread
    if numa_nodes == 1:
        return NUMA_NODE + spread
    return CROSS_NUMA + spread


def satisfies(gpus, topology):
    if topology == 'numa':
        return same_numa(gpus)
    if topology == 'nvlink':
        return len(gpus) < 2 or nvlink_connected(gpus)
    return True


def candidate_sets(gpus, count):
    """GPU sets of size ``count`` worth scoring, each local where possible.

    Rather than every combination, take each locality group (an NVLink
    clique around a GPU, a PCIe switch, a NUMA node, the host) and the
    ``count`` best-packed GPUs in it; ``gpus`` is ordered best first.
    """
    if count == 1:
        return [(g,) for g in gpus]
    if len(gpus) < count:
        return []
    groups = []
    seen_cliques = set()
    for g in gpus:
        members = frozenset(g.nvlink_peers | {g.index})
        if members in seen_cliques:
            continue  # NVSwitch: every GPU sees the same clique
        seen_cliques.add(members)
        groups.append([g] + [p for p in gpus if p.index in g.nvlink_peers])
    by_switch, by_numa = {}, {}
    for g in gpus:
        if g.pcie_switch is not None:
            by_switch.setdefault(g.pcie_switch, []).append(g)
        by_numa.setdefault(g.numa_node, []).append(g)
    groups.extend(by_switch.values())
    groups.extend(by_numa.values())
    groups.append(list(gpus))
    seen, result = set(), []
    for group in groups:
        if len(group) < count:
            continue
        chosen = _pick(group, count)
        key = tuple(sorted(g.index for g in chosen))
        if key not in seen:
            seen.add(key)
            result.append(tuple(chosen))
    return result


def _pick(group, count):
    """``count`` GPUs of ``group``, keeping NVLink cliques and switches."""
    first = group[0]
    ranked = sorted(group, key=lambda g: (
        g is not first and g.index not in first.nvlink_peers,
        g.pcie_switch != first.pcie_switch,
        g.numa_node != first.numa_node))
    return ranked[:count]
