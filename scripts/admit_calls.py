#!/usr/bin/env python3
"""Admit rounds for redis-cli --pipe, as a committer sends them, for the scripts that count the
bare admit script's cost (redis-instructions.sh, primary-cost.sh).

Writes DIR/setup.resp (an open event of the given levels, each with a cap no round reaches, and N
free seats) and DIR/calls.resp (N fresh codes in rounds of BATCH attempts, each round one
admit.lua call, or BATCH calls of one attempt with --form one; with --wait a `WAIT 0 0` after each
round; with --marks M, after every M admissions one ZREM marking them, as the database writer's
mark does: pending entries are named "code-hash admission-id")."""
import argparse
import hashlib


def resp(*args):
    out = [b'*%d\r\n' % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b'$%d\r\n%s\r\n' % (len(a), a))
    return b''.join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument('dir')
    p.add_argument('n', type=int)
    p.add_argument('batch', type=float,
                   help='attempts a round; a fraction mixes the two sizes around it to that average '
                        '(3.7: rounds of 3 and 4, as a committer under load sends them)')
    p.add_argument('sha', help="admit.lua's SHA, loaded on the server")
    p.add_argument('--form', choices=['many', 'one'], default='many')
    p.add_argument('--levels', type=int, default=1, help='levels asked for in turn: A1, B1, C1')
    p.add_argument('--marks', type=int, default=0)
    p.add_argument('--tag', default='ev:b', help="the event's hash tag")
    p.add_argument('--wait', action='store_true')
    a = p.parse_args()
    levels = ['A1', 'B1', 'C1'][:a.levels]
    keys = ['{%s}:%s' % (a.tag, k) for k in ('adm', 'taken', 'cap', 'free', 'pending', 'meta')]
    with open(a.dir + '/setup.resp', 'wb') as f:
        for level in levels:
            f.write(resp('HSET', keys[2], level, 10 ** 9))
        f.write(resp('HSET', keys[5], 'state', 'open'))  # admit.lua admits only while open
        for s in range(1, a.n + 1, 1000):
            args = []
            for seat in range(s, min(a.n, s + 999) + 1):
                args += [seat, seat]
            f.write(resp('ZADD', keys[3], *args))
    with open(a.dir + '/calls.resp', 'wb') as f:
        codes = [hashlib.sha256(b'%s %d' % (a.tag.encode(), i)).hexdigest() for i in range(a.n)]
        unmarked = []
        # Round k ends after floor((k + 1) * batch) attempts: sizes floor(batch) and ceil(batch),
        # averaging batch.
        ends = []
        while not ends or ends[-1] < a.n:
            ends.append(min(a.n, int((len(ends) + 1) * a.batch)))
        starts = [0] + ends[:-1]
        for r, end in zip(starts, ends):
            if end == r:
                continue
            attempts = [(c, 'nonce-' + c[:16], levels[(r + j) % len(levels)], 'adm-' + c[:24])
                        for j, c in enumerate(codes[r:end])]
            if a.form == 'one':
                for t in attempts:
                    f.write(resp('EVALSHA', a.sha, len(keys), *keys, *t))
            else:
                f.write(resp('EVALSHA', a.sha, len(keys), *keys, *[x for t in attempts for x in (*t, 'admit')]))
            if a.wait:
                f.write(resp('WAIT', 0, 0))
            unmarked += attempts
            while a.marks and len(unmarked) >= a.marks:
                marked, unmarked = unmarked[:a.marks], unmarked[a.marks:]
                f.write(resp('ZREM', keys[4], *['%s %s' % (t[0], t[3]) for t in marked]))


if __name__ == '__main__':
    main()
