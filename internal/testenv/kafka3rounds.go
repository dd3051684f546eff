package testenv

import (
	"fmt"
	"testing"
	"time"
)

// LeaderKills is the broker-restart fault both Kafka packages are tested
// under. It starts a load on topic (see StartLoad), waits until every
// partition has 20 messages applied, then runs rounds: each kills the
// leader of a partition (every other round, the node that also
// coordinates group, when it leads one), keeps it down at least 3 s and
// until that partition has 50 more messages applied (so through the new
// leader), and starts it again. applied(p) is what the consumers applied
// of partition p (p -1: in all); running is called while waiting, to fail
// the test if a consumer stopped; status adds to each round's log line.
// It returns the load, still producing, and how many kills hit the
// coordinator.
func (k *KafkaCluster) LeaderKills(t testing.TB, topic, group string, partitions, rounds int,
	applied func(p int) int, running func(), status func() string) (load *Load, coordinatorKills int) {
	t.Helper()
	load = k.StartLoad(topic, partitions, 20*time.Millisecond)
	Until(t, "the consumers applying every partition", func() (bool, error) {
		running()
		for p := range partitions {
			if applied(p) < 20 {
				return false, nil
			}
		}
		return true, nil
	})
	for round := range rounds {
		// Chosen under the fault lock, so no other test's kill moves the
		// leaders meanwhile.
		t0 := time.Now()
		k.Lock()
		p := round % partitions
		coordinator := k.Coordinator(group)
		if round%2 == 1 {
			for q := range partitions {
				if k.Leader(topic, q) == coordinator {
					p = q
					break
				}
			}
		}
		leader := k.Leader(topic, p)
		if coordinator == leader {
			coordinatorKills++
		}
		before := load.Acked() / partitions // about what each partition had before the kill
		k.Kill(leader)
		killed := time.Since(t0)
		downSince := time.Now()
		Until(t, fmt.Sprintf("round %d: partition %d applied with node %d down", round, p, leader), func() (bool, error) {
			running()
			return applied(p) >= before+50, nil
		})
		if rest := 3*time.Second - time.Since(downSince); rest > 0 {
			time.Sleep(rest) // the fault's length, not an ordering
		}
		down, t1 := time.Since(downSince), time.Now()
		k.Start(leader)
		t.Logf("round %d: killed node %d (leader of partition %d) and saw it fenced in %v (waiting for the fault lock included), down %v more, started and in sync in %v; %d acknowledged, %d applied; %s",
			round, leader, p, killed.Round(time.Millisecond), down.Round(time.Millisecond), time.Since(t1).Round(time.Millisecond), load.Acked(), applied(-1), status())
	}
	return load, coordinatorKills
}
