"""Fuzzed flavor extra specs through the real Nova API (reliability part).

Sends random extra specs, one per request, to ``POST
/flavors/{id}/os-extra_specs`` at microversion 2.86 (where Nova validates
extra specs) of the in-process cloud (``nova_gpu.tests.harness.cloud``: the
real
Nova API with nova-gpu's validators loaded through their entry point),
and checks each answer:

* no HTTP 5xx, and nothing but 200 or 400;
* every 400 names the offending key;
* no key that only looks like a ``gpu:`` key (``GPU:count``) is accepted;
* every accepted spec, read back from the API, is one ``flavor.parse``
  understands (alone, or with ``gpu:memory`` for ``gpu:compute``), and
  no flavor built from accepted specs makes ``parse`` crash;
* the GPU quota classes of every accepted key and flavor
  (``core.quota.extra_specs``, what ``openstack gpu flavor keys --quota``
  prints) are Placement resource classes with positive amounts, and
  random model names, regions and default limits (``openstack gpu quota
  limits``) give a class and a command a shell runs as written, or a
  clear refusal, never a crash.

Keys are drawn in and near the ``gpu:`` namespace, values from valid ones,
Unicode digits, huge and negative numbers, JSON numbers (NaN and infinity
included), empty strings, control characters and long strings. The run is
seeded, hence repeatable. Run it with ``tox -e bench -- --only
reliability`` or ``python -m nova_gpu.bench.reliability specs``.
"""

import dataclasses
import random
import re
import shlex
import time

from oslo_serialization import jsonutils

from nova_gpu.bench import reliability
from nova_gpu.core import exceptions
from nova_gpu.core import flavor as grammar
from nova_gpu.core import quota
from nova_gpu.scheduler import gpu_spec as flavor_mod

PART = 'specs'
FULL = 10000
QUICK = 1000
# The full run stops sending here: about 150 s on an idle 2-core machine,
# so the bound only cuts a run on a loaded one (and the count then shows
# it).
BUDGET_S = 420
MICROVERSION = '2.86'
NEW_FLAVOR_EVERY = 200  # accepted specs gather on a flavor, then a new one

_NAMES = tuple(k[len(grammar.PREFIX):] for k in grammar.KEYS)
_DIGITS = ('0123456789', '\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667'
           '\u0668\u0669', '\u0966\u0967\u0968\u0969\u096a\u096b\u096c'
           '\u096d\u096e\u096f', '\uff10\uff11\uff12\uff13\uff14\uff15'
           '\uff16\uff17\uff18\uff19', '\u2070\u00b9\u00b2\u00b3\u2074',
           '\U0001d7ce\U0001d7cf\U0001d7d0\U0001d7d1')
_JUNK = ('\x00', '\x01', '\x1c', '\x1f', '\x7f', '\x85', '\u00a0',
         '\u200b', '\u2028', '\u3000', '\ufeff', '\n', '\t', '\r', ' ', '_',
         '+', '-', '.', ',', '%', '"', "'", '\\', '/', '<', '&', ':')


# The documented grammar of each value, written independently of the
# parser: what an accepted value must look like.
_GRAMMAR = {
    'memory': re.compile(r'[0-9]+(\.[0-9]+)? ?([MGT]i?B)', re.I | re.A),
    'compute': re.compile(r'[0-9]+(\.[0-9]+)?%?', re.A),
    'kind': re.compile('|'.join(grammar.KINDS)),
    'topology': re.compile(r'any|numa|nvlink'),
    'backend': re.compile(r'mdev|vfio'),
    'preemptible': re.compile(r'true|false'),
    'rdma': re.compile(r'true|false'),
}
_PRINTABLE = re.compile(r'[\x20-\x7e]+')


def outside_grammar(key, value):
    """Whether an accepted ``gpu:`` value breaks the documented grammar."""
    name = key[len(grammar.PREFIX):]
    if not _PRINTABLE.fullmatch(value):
        return True
    if name == 'count':
        return not (value.isascii() and value.isdigit()
                    and 1 <= int(value) <= flavor_mod.max_count())
    pattern = _GRAMMAR.get(name)
    return pattern is not None and not pattern.fullmatch(value)


@dataclasses.dataclass
class Tally:
    """What the fuzzer saw; ``failures`` lists one line per bad answer."""

    sent: int = 0
    accepted: int = 0
    refused: int = 0
    server_errors: int = 0
    other_status: int = 0
    unnamed_400: int = 0
    accepted_near_miss: int = 0
    outside_grammar: int = 0
    parse_refused: int = 0
    parse_crashed: int = 0
    quota_checked: int = 0
    quota_bad: int = 0
    seconds: float = 0.0
    failures: list = dataclasses.field(default_factory=list)

    def fail(self, what, key, value, detail):
        if len(self.failures) < 50:
            self.failures.append('%s: %s=%s: %s' % (
                what, ascii(key), ascii(value)[:80], str(detail)[:300]))

    @property
    def bad(self):
        return (self.server_errors + self.other_status + self.unnamed_400
                + self.accepted_near_miss + self.outside_grammar
                + self.parse_refused
                + self.parse_crashed + self.quota_bad)


class Fuzzer:
    """Random ``(key, value)`` pairs; ``value`` may be a raw JSON number."""

    def __init__(self, seed, catalog=None):
        self.rng = random.Random(seed)
        self.catalog = catalog or flavor_mod.default_catalog()
        self.profiles = self.catalog.vgpu_profile_names()
        self.migs = self.catalog.mig_profile_names()
        self.models = sorted(self.catalog.models)

    def pair(self):
        rng = self.rng
        name = rng.choice(_NAMES)
        roll = rng.random()
        if roll < 0.45:
            key = grammar.PREFIX + name
        elif roll < 0.75:
            key = self._near_key(name)
        else:
            key = self._other_key(name)
        return key, self.value(name)

    def _near_key(self, name):
        rng = self.rng
        ns = rng.choice(['GPU', 'Gpu', 'gPu', ' gpu', 'gpu ', ' GPU ',
                         'gpu', 'gpu', '  gpu'])
        name = rng.choice([name, name.upper(), name.capitalize(),
                           ' ' + name, name + ' ', name[:-1],
                           name + name[-1], ':' + name, ''])
        sep = rng.choice([':', ':', ' :', ': '])
        return ns + sep + name

    def _other_key(self, name):
        rng = self.rng
        return rng.choice([
            '\uff47\uff50\uff55:' + name,         # fullwidth gpu
            'gpu\uff1a' + name,                   # fullwidth colon
            'gpu:' + name + '\n',
            'gpu:' + name + rng.choice(_JUNK),
            rng.choice(_JUNK) + 'gpu:' + name,
            'gpu:' + 'x' * rng.randint(250, 300),
            'gpu_' + name, 'gpu.' + name, 'gpus:' + name, 'gpu',
            'gpu:', 'gpu::' + name, 'vgpu:' + name,
            'gpu:' + ''.join(rng.choice('abcdefghijklmnopqrstuvwxyz_')
                             for _ in range(rng.randint(1, 12))),
        ])

    def value(self, name):
        rng = self.rng
        roll = rng.random()
        if roll < 0.35:
            return self._valid(name)
        if roll < 0.45:
            return self._mutated(self._valid(name))
        if roll < 0.60:
            return self._digits()
        if roll < 0.70:
            return self._number()
        return rng.choice([
            '', ' ', '-1', '-0', '0', '+1', '1_0', '0x10', '1e3', 'inf',
            'nan', 'Infinity', '-inf', 'NaN', '1.', '.5', '00', '0.0',
            '0.0001GB', '0.5MB', '1_024MB', '1e400GB', '-20GB', '20 GB',
            '20gb', '20 G', '9' * 300, 'A' * 255, 'A' * 256,
            'True', 'TRUE', 'yes', 'on', '1', 't', 'false ',
            ''.join(rng.choice(_JUNK) for _ in range(rng.randint(1, 8))),
            ''.join(chr(rng.randint(0, 0x2fff))
                    for _ in range(rng.randint(1, 20))),
        ])

    def _valid(self, name):
        rng = self.rng
        return {
            'profile': lambda: rng.choice(self.profiles),
            'mig': lambda: rng.choice(self.migs),
            'count': lambda: str(rng.randint(1, flavor_mod.max_count())),
            'model': lambda: ','.join(rng.sample(self.models,
                                                 rng.randint(1, 3))),
            'topology': lambda: rng.choice(('any', 'numa', 'nvlink')),
            'memory': lambda: rng.choice(('%dGB' % rng.randint(1, 140),
                                          '%dMB' % rng.randint(1, 81920),
                                          '%.1fGiB' % rng.uniform(0.1, 80))),
            'compute': lambda: rng.choice(('%.2f' % rng.uniform(0.01, 1),
                                           '%d%%' % rng.randint(1, 100))),
            'kind': lambda: rng.choice(grammar.KINDS),
            'backend': lambda: rng.choice(grammar.BACKENDS),
            'preemptible': lambda: rng.choice(grammar.BOOLEANS),
            'rdma': lambda: rng.choice(grammar.BOOLEANS),
        }[name]()

    def _mutated(self, value):
        rng = self.rng
        i = rng.randint(0, len(value))
        how = rng.randint(0, 3)
        if how == 0:
            return value[:i] + rng.choice(_JUNK) + value[i:]
        if how == 1:
            return value.lower() if rng.random() < 0.5 else value.upper()
        if how == 2:
            return value[:i] + value[i + 1:]
        return value * rng.randint(2, 40)

    def _digits(self):
        rng = self.rng
        digits = rng.choice(_DIGITS)
        text = ''.join(rng.choice(digits) for _ in range(rng.randint(1, 4)))
        return text + rng.choice(('', '', 'GB', 'MB', '%', '.5'))

    def _number(self):
        """A JSON number, as raw JSON text (NaN and 1e400 included)."""
        rng = self.rng
        return RawNumber(rng.choice([
            '2', '8', '9', '16', '0', '-1', '2.0', '0.5', '1e3', '1e400',
            '-1e400', 'NaN', 'Infinity', '-Infinity', str(2 ** 70),
            '1' + '0' * 254, '0.25', '1.5e-9']))


class RawNumber(str):
    """A value sent as a bare JSON number rather than a string."""


def _body(key, value):
    if isinstance(value, RawNumber):
        return '{"extra_specs": {%s: %s}}' % (jsonutils.dumps(key), value)
    return jsonutils.dumps({'extra_specs': {key: value}})


def _names_key(message, key):
    return any(form in message for form in (
        key, repr(key), ascii(key), jsonutils.dumps(key)[1:-1]))


def _message(response):
    try:
        body = jsonutils.loads(response.content)
    except ValueError:
        return response.text
    return ' '.join(str(v.get('message', v)) if isinstance(v, dict)
                    else str(v) for v in body.values())


def _parse_alone(key, value):
    specs = {key: value}
    if key == 'gpu:compute':
        specs['gpu:memory'] = '1GB'
    return flavor_mod.parse(specs)


class Run:
    """One fuzzing session against ``admin_api`` (a Nova test client)."""

    def __init__(self, admin_api, seed=0):
        self.api = admin_api
        self.fuzzer = Fuzzer(seed)
        self.tally = Tally()
        self.flavor_id = None
        self._on_flavor = 0
        self._pending = set()  # accepted keys not read back yet

    def _new_flavor(self):
        if self.flavor_id is not None:
            self._flush()
            self._check_whole_flavor()
            self.api.api_delete('/flavors/%s' % self.flavor_id)
        flavor = self.api.api_post('/flavors', {'flavor': {
            'name': 'fuzz-%d' % self.tally.sent, 'ram': 512, 'vcpus': 1,
            'disk': 1}}).body['flavor']
        self.flavor_id = flavor['id']
        self._on_flavor = 0

    def _stored(self):
        return self.api.api_get('/flavors/%s/os-extra_specs'
                                % self.flavor_id).body['extra_specs']

    def _check_whole_flavor(self):
        specs = self._stored()
        try:
            spec = flavor_mod.parse(specs)
        except exceptions.GpuError:
            return  # keys that contradict each other: per flavor, not per key
        except Exception as e:
            self.tally.parse_crashed += 1
            self.tally.fail('whole flavor crashed parse', 'flavor', specs,
                            repr(e))
            return
        check_quota(self.tally, spec, self.fuzzer.catalog, 'flavor', specs)

    def send(self, key, value):
        t = self.tally
        if self.flavor_id is None or self._on_flavor >= NEW_FLAVOR_EVERY:
            self._new_flavor()
        if key in self._pending:
            self._flush()  # read it back before it is overwritten
        t.sent += 1
        old = self.api.microversion
        self.api.microversion = MICROVERSION
        try:
            response = self.api.api_request(
                '/flavors/%s/os-extra_specs' % self.flavor_id,
                method='POST', body=_body(key, value),
                headers={'Content-Type': 'application/json'})
        finally:
            self.api.microversion = old
        status = response.status_code
        if status >= 500:
            t.server_errors += 1
            t.fail('HTTP %d' % status, key, value, response.text)
        elif status == 400:
            t.refused += 1
            message = _message(response)
            if not _names_key(message, key):
                t.unnamed_400 += 1
                t.fail('400 without the key', key, value, message)
        elif status == 200:
            t.accepted += 1
            self._on_flavor += 1
            self._pending.add(key)
        else:
            t.other_status += 1
            t.fail('HTTP %d' % status, key, value, response.text)

    def _flush(self):
        """Read the accepted specs back (one GET for several) and check."""
        if self._pending:
            stored = self._stored()
            for key in sorted(self._pending):
                self._check_accepted(key, stored.get(key))
            self._pending.clear()

    def _check_accepted(self, key, stored):
        t = self.tally
        if grammar.near_miss(key):
            t.accepted_near_miss += 1
            t.fail('near-miss key accepted', key, stored, '')
        if not key.startswith(grammar.PREFIX):
            return
        if outside_grammar(key, stored):
            t.outside_grammar += 1
            t.fail('accepted outside the grammar', key, stored, '')
        try:
            spec = _parse_alone(key, stored)
        except exceptions.GpuError as e:
            t.parse_refused += 1
            t.fail('accepted, then refused by parse', key, stored, e)
        except Exception as e:
            t.parse_crashed += 1
            t.fail('accepted, then crashed parse', key, stored, repr(e))
        else:
            check_quota(t, spec, self.fuzzer.catalog, key, stored)

    def run(self, count, budget_s=None):
        start = time.perf_counter()
        for _ in range(count):
            if budget_s and time.perf_counter() - start > budget_s:
                break
            self.send(*self.fuzzer.pair())
        if self.flavor_id is not None:
            self._flush()
            self._check_whole_flavor()
        self.tally.seconds = time.perf_counter() - start
        return self.tally


# A Placement resource class (placement's schema: CUSTOM_ and at most 255
# characters of A-Z, 0-9 and _).
_RESOURCE_CLASS = re.compile(r'CUSTOM_[A-Z0-9_]{1,248}')


def check_quota(tally, spec, catalog, key, value):
    """Count the GPU quota keys of ``spec`` that are not Placement's."""
    tally.quota_checked += 1
    try:
        keys = quota.extra_specs(spec, catalog)
    except Exception as e:
        tally.quota_bad += 1
        tally.fail('quota classes crashed', key, value, repr(e))
        return
    for name, amount in keys.items():
        rc = name[len('resources:'):]
        if not (name.startswith('resources:') and
                _RESOURCE_CLASS.fullmatch(rc) and amount.isdigit() and
                int(amount) > 0):
            tally.quota_bad += 1
            tally.fail('malformed quota key', key, value,
                       '%s=%s' % (name, amount))


def fuzz_quota_names(tally, rng, count):
    """Random model names, regions and limits through the quota names:
    a class Placement takes and a command a shell runs as its words, or
    ``InvalidRequest``; anything else counts as bad.
    """
    for _ in range(count):
        name = ''.join(rng.choice(_JUNK + tuple('Hh100-GB ab')) for _ in
                       range(rng.randint(0, 40)))
        if rng.random() < 0.05:
            name = 'H' * rng.randint(250, 300)
        region = rng.choice((None, 'RegionOne', name, '-x', ''))
        limit = rng.choice((0, 1, -1, -2, '4', 2 ** 40, 1.5, None))
        tally.quota_checked += 1
        try:
            rc = quota.model_class(name, rng.choice(quota.KINDS))
            command = quota.limit_command('class:' + rc, limit, region)
        except exceptions.InvalidRequest:
            continue
        except Exception as e:
            tally.quota_bad += 1
            tally.fail('quota names crashed', 'model', name, repr(e))
            continue
        try:
            words = shlex.split(command)
        except ValueError:  # an unbalanced quote: a broken command
            words = []
        if not _RESOURCE_CLASS.fullmatch(rc) or words[-1:] != ['class:' + rc] \
                or (region and region not in words):
            tally.quota_bad += 1
            tally.fail('bad quota class or command', 'model', name,
                       '%s / %s' % (rc, command))


def figures(tally, wanted):
    def row(name, value, target, ok):
        return reliability.Figure(PART, name, value, target, ok)

    rate = tally.sent / tally.seconds if tally.seconds else 0
    return [
        row('specs sent (accepted / refused)', '%d (%d / %d)'
            % (tally.sent, tally.accepted, tally.refused),
            '>= %d' % wanted, tally.sent >= wanted),
        row('HTTP 5xx', tally.server_errors, '0', not tally.server_errors),
        row('status neither 200 nor 400', tally.other_status, '0',
            not tally.other_status),
        row('400s not naming the key', tally.unnamed_400, '0',
            not tally.unnamed_400),
        row('near-miss gpu keys accepted', tally.accepted_near_miss, '0',
            not tally.accepted_near_miss),
        row('accepted values outside the grammar', tally.outside_grammar,
            '0', not tally.outside_grammar),
        row('accepted, then refused by flavor.parse', tally.parse_refused,
            '0', not tally.parse_refused),
        row('accepted, then crashed flavor.parse', tally.parse_crashed, '0',
            not tally.parse_crashed),
        row('GPU quota keys and names checked: malformed or crashed',
            '%d: %d' % (tally.quota_checked, tally.quota_bad), '0',
            not tally.quota_bad),
        row('specs/second', round(rate, 1), '-', True),
    ]


def run(quick=False, seed=20261201):
    """Reliability rows for ``quick`` (~1,000 specs) or full (10,000)."""
    from nova_gpu.tests.harness import cloud
    wanted = QUICK if quick else FULL
    case = cloud.start_cloud([])
    try:
        tally = Run(case.api_fixture.admin_api, seed).run(wanted, BUDGET_S)
    finally:
        case.doCleanups()
    fuzz_quota_names(tally, random.Random(seed), wanted // 10)
    for line in tally.failures:
        print('  ' + line)
    return figures(tally, wanted)


if __name__ == '__main__':
    import sys
    sys.exit(reliability.part_main(PART, run))
