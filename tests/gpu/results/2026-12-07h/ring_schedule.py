# The deep key ring of codegen/templates/mla_ring.cuh (the few-heads kernel's and the wide
# kernel's deep form), simulated for 2 to 5 stages and 0 to 19 tiles from three starts: STAGES − 1
# tiles go out first, one cp.async group each (empty past the last tile); at tile u the kernel
# waits until at most STAGES − 2 groups are pending, passes a barrier and refills the stage of
# tile u − 1 with tile u + STAGES − 1 (one group, empty past the last). Asserts that tile u has
# landed in stage u's slot when it is computed and that a refill only takes the stage of the tile
# just finished.

def simulate(u0, u1, stages):
    held = [None] * stages
    groups = []
    for i in range(stages - 1):
        if u0 + i < u1:
            held[i] = u0 + i
            groups.append((i, u0 + i))
        else:
            groups.append(None)
    for u in range(u0, u1):
        s = (u - u0) % stages
        landed = {g for g in groups[:len(groups) - (stages - 2)] if g}
        assert (s, u) in landed and held[s] == u, (u, s, held)
        refill = stages - 1 if s == 0 else s - 1
        if u + stages - 1 < u1:
            assert held[refill] in (None, u - 1), (u, refill, held)
            held[refill] = u + stages - 1
            groups.append((refill, u + stages - 1))
        else:
            groups.append(None)


for stages in range(2, 6):
    for u0 in range(0, 6, 2):
        for n in range(20):
            simulate(u0, u0 + n, stages)
print("ring schedule ok")
