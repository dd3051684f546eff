package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// EnvKafka3 names the brokers of the three-node Kafka cluster, comma
// separated in node order (node N listens on 127.0.0.1:19N92;
// `scripts/services kafka3 env` prints it).
const EnvKafka3 = "NOLOCK_TEST_KAFKA3"

// EnvRequireKafka3, set to anything, makes a missing three-node cluster
// fail a test instead of skipping it.
const EnvRequireKafka3 = "NOLOCK_REQUIRE_KAFKA3"

// KafkaCluster is the three-node Kafka cluster that `scripts/services
// kafka3 up` starts, for tests that kill a broker: every node is a broker
// and a controller, topics are replicated three times, and
// min.insync.replicas is 2, so an acks=all write survives the loss of one
// node. Nodes are numbered 1 to 3; a node's number is its broker ID.
//
// The cluster is shared by every test that uses it, in every package's
// test binary at once, and it survives one node down only. So a node is
// killed only under a lock that all of them share (a file lock): Lock (or
// Kill) takes it, after checking that all three nodes serve and every
// partition's replicas are in sync, and Start releases it once the node is
// back and in sync again. CreateTopic and ReadLog take it too (a
// replication factor of 3 needs three brokers; a read is not cut off).
// Kills by different tests therefore never overlap, but a test sees the
// other tests' kills: its consumers must ride them out too.
//
// A KafkaCluster is used from the test's goroutine only.
type KafkaCluster struct {
	t       testing.TB
	brokers []string
	lock    *os.File // the fault lock, while held
	down    int      // the node this test killed and has not started, or 0
}

// Kafka3 returns the three-node cluster (NOLOCK_TEST_KAFKA3). When the
// variable is unset it fails the test where the cluster is required (see
// Kafka3Required) and skips it otherwise, naming `scripts/services kafka3
// up`. A node found down (a test process that died between a kill and its
// restart) is started first. When the test ends, a node it killed is
// started again and the lock released.
func Kafka3(t testing.TB) *KafkaCluster {
	t.Helper()
	v := os.Getenv(EnvKafka3)
	if v == "" {
		msg := EnvKafka3 + " is not set: the three-broker cluster is opt-in (scripts/test does not start it); start it with `scripts/services kafka3 up` and load it with `eval \"$(scripts/services kafka3 env)\"`"
		if Kafka3Required() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	k := &KafkaCluster{t: t, brokers: strings.Split(v, ",")}
	if len(k.brokers) != 3 {
		t.Fatalf("testenv: %s=%q: want three brokers", EnvKafka3, v)
	}
	t.Cleanup(k.heal)
	k.acquire()
	for n := 1; n <= 3; n++ {
		if _, err := k.pid(n); err != nil {
			t.Logf("testenv: kafka3 node %d is down (%v): starting it", n, err)
			k.startNode(n)
		}
	}
	k.waitInSync("all three nodes serving, every replica in sync")
	k.release()
	return k
}

// Kafka3Required reports whether a missing three-node cluster fails a
// test instead of skipping it: only when NOLOCK_REQUIRE_KAFKA3 is set. The
// cluster is opt-in (scripts/test does not start it, see docs/testing.md),
// so CI and NOLOCK_REQUIRE_SERVICES, which require the default services,
// do not require it.
func Kafka3Required() bool { return os.Getenv(EnvRequireKafka3) != "" }

// Brokers returns the cluster's bootstrap addresses.
func (k *KafkaCluster) Brokers() []string { return slices.Clone(k.brokers) }

// CreateTopic creates a fresh topic with the given number of partitions,
// each replicated on all three nodes, and deletes it when the test ends.
// It returns once every partition's leader serves it and its three
// replicas are in sync.
func (k *KafkaCluster) CreateTopic(partitions int) string {
	k.t.Helper()
	topic := Name("t")
	if k.lock == nil {
		k.Lock()
		defer k.release()
	}
	ctx, cancel := context.WithTimeout(context.Background(), Scale(time.Minute))
	defer cancel()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(k.brokers...), Transport: tr, Timeout: 30 * time.Second}
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: 3,
	}}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		k.t.Fatalf("testenv: create topic %s: %v", topic, err)
	}
	k.t.Cleanup(func() {
		// Under the lock (no other test's node goes down meanwhile), and
		// again after a failure: a node this test killed may still be down.
		if k.lock == nil {
			k.acquire()
			defer k.release()
		}
		err := Poll("topic "+topic+" deleted", func() (bool, error) {
			err := deleteTopic(k.brokers, topic)
			if err != nil {
				k.t.Logf("testenv: delete topic %s: %v; trying again", topic, err)
			}
			return err == nil || errors.Is(err, kafka.UnknownTopicOrPartition), nil
		})
		if err != nil {
			k.t.Errorf("testenv: %v", err)
		}
	})
	Until(k.t, "topic "+topic+" replicated and served", func() (bool, error) {
		parts, _, err := k.metadata(0, topic)
		if err != nil || len(parts) != partitions || !inSync(parts) {
			return false, nil
		}
		reqs := make([]kafka.OffsetRequest, partitions)
		for p := range reqs {
			reqs[p] = kafka.LastOffsetOf(p)
		}
		tr := &kafka.Transport{} // a fresh metadata cache: the leaders just elected
		defer tr.CloseIdleConnections()
		c := &kafka.Client{Addr: kafka.TCP(k.brokers...), Transport: tr, Timeout: 10 * time.Second}
		lo, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
		if err != nil || len(lo.Topics[topic]) != partitions {
			return false, nil
		}
		for _, po := range lo.Topics[topic] {
			if po.Error != nil {
				return false, nil
			}
		}
		return true, nil
	})
	return topic
}

func deleteTopic(brokers []string, topic string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: tr, Timeout: 30 * time.Second}
	res, err := client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	if err == nil {
		err = res.Errors[topic]
	}
	return err
}

// Leader returns the node that leads the partition of topic, as the
// cluster's metadata names it now.
func (k *KafkaCluster) Leader(topic string, partition int) int {
	k.t.Helper()
	var leader int
	Until(k.t, fmt.Sprintf("a leader for %s/%d", topic, partition), func() (bool, error) {
		parts, _, err := k.metadata(k.down, topic)
		if err != nil {
			return false, nil
		}
		for _, p := range parts {
			if p.ID == partition && p.Leader.ID != 0 {
				leader = p.Leader.ID
				return true, nil
			}
		}
		return false, nil
	})
	return leader
}

// Coordinator returns the node that coordinates the consumer group, or 0
// if the cluster does not answer.
func (k *KafkaCluster) Coordinator(group string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	c := &kafka.Client{Addr: kafka.TCP(k.brokers...), Transport: tr, Timeout: 5 * time.Second}
	res, err := c.FindCoordinator(ctx, &kafka.FindCoordinatorRequest{Key: group, KeyType: kafka.CoordinatorKeyTypeConsumer})
	if err != nil || res.Error != nil || res.Coordinator == nil {
		return 0
	}
	return res.Coordinator.NodeID
}

// Lock takes the fault lock and returns once all three nodes serve and
// every replica is in sync. From then on no other test kills a node, so
// the leaders and the coordinator it reads stay put until this test's own
// Kill; the lock is held until Start (or the end of the test). Call it
// before choosing the node to kill.
func (k *KafkaCluster) Lock() {
	k.t.Helper()
	if k.lock != nil {
		return
	}
	k.acquire()
	k.waitInSync("all three nodes serving, every replica in sync")
}

// Kill ends node n with SIGKILL, as a crash would: no controlled
// shutdown, its partitions' leadership is not handed over. It takes the
// fault lock first, if Lock did not. It returns once the process is gone
// and the cluster has fenced the node: the metadata lists it no more and
// no partition names it as leader. The lock is held until Start(n).
func (k *KafkaCluster) Kill(n int) {
	k.t.Helper()
	if k.down != 0 {
		k.t.Fatalf("testenv: kafka3: kill node %d while node %d is down", n, k.down)
	}
	k.Lock()
	pid, err := k.pid(n)
	if err != nil {
		k.t.Fatalf("testenv: kafka3 node %d: %v", n, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		k.t.Fatalf("testenv: kafka3: kill node %d (pid %d): %v", n, pid, err)
	}
	k.down = n
	Until(k.t, fmt.Sprintf("kafka3 node %d (pid %d) gone", n, pid), func() (bool, error) { return !alive(pid), nil })
	Until(k.t, fmt.Sprintf("kafka3 node %d fenced by the cluster", n), func() (bool, error) {
		parts, brokers, err := k.metadata(n)
		if err != nil || slices.Contains(brokers, n) {
			return false, nil
		}
		for _, p := range parts {
			if p.Leader.ID == n {
				return false, nil
			}
		}
		return true, nil
	})
}

// Start starts node n again with `scripts/services kafka3 start n` after
// Kill(n), and returns, releasing the fault lock, once the node serves
// and every partition's replicas, its own included, are back in sync: the
// cluster can lose a node again.
func (k *KafkaCluster) Start(n int) {
	k.t.Helper()
	if k.down != n {
		k.t.Fatalf("testenv: kafka3: start node %d, but the node this test killed is %d", n, k.down)
	}
	k.startNode(n)
	k.waitInSync(fmt.Sprintf("kafka3 node %d back, every replica in sync", n))
	k.down = 0
	k.release()
}

// heal runs when the test ends: a node it killed is started again and the
// lock released, so the next test finds three nodes.
func (k *KafkaCluster) heal() {
	if k.down != 0 {
		if out, err := k.script("start", k.down); err != nil {
			k.t.Errorf("testenv: kafka3: start node %d after the test: %v\n%s", k.down, err, out)
		}
		k.down = 0
	}
	k.release()
}

// startNode runs the services script's start for node n, which returns once
// the node answers metadata requests.
func (k *KafkaCluster) startNode(n int) {
	k.t.Helper()
	if out, err := k.script("start", n); err != nil {
		k.t.Fatalf("testenv: kafka3: start node %d: %v\n%s", n, err, out)
	}
}

// waitInSync waits until every node serves and every partition of every
// topic has a leader and all its replicas in sync.
func (k *KafkaCluster) waitInSync(what string) {
	k.t.Helper()
	Until(k.t, what, func() (bool, error) {
		parts, brokers, err := k.metadata(0)
		return err == nil && len(brokers) == 3 && inSync(parts), nil
	})
}

// inSync reports whether every partition has a leader and all its
// replicas in sync.
func inSync(parts []kafka.Partition) bool {
	for _, p := range parts {
		if p.Leader.ID == 0 || len(p.Isr) != len(p.Replicas) {
			return false
		}
	}
	return true
}

// metadata asks a node other than skip (0: any) for the partitions of
// topics (none: of every topic) and the IDs of the brokers the cluster
// lists (the unfenced ones), over a connection of its own: kafka-go's
// Client answers metadata from a cache.
func (k *KafkaCluster) metadata(skip int, topics ...string) ([]kafka.Partition, []int, error) {
	var errs []error
	for n, addr := range k.brokers {
		if n+1 == skip {
			continue
		}
		parts, brokers, err := k.ask(addr, topics)
		if err == nil {
			return parts, brokers, nil
		}
		errs = append(errs, err)
	}
	return nil, nil, errors.Join(errs...)
}

func (k *KafkaCluster) ask(addr string, topics []string) ([]kafka.Partition, []int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := (&kafka.Dialer{Timeout: 3 * time.Second}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return nil, nil, err
	}
	brokers, err := conn.Brokers()
	if err != nil {
		return nil, nil, err
	}
	parts, err := conn.ReadPartitions(topics...)
	if err != nil {
		return nil, nil, err
	}
	ids := make([]int, len(brokers))
	for i, b := range brokers {
		ids[i] = b.ID
	}
	return parts, ids, nil
}

// pid returns node n's broker process, from the services script's pid
// file, after checking that it is alive and is that node's broker.
func (k *KafkaCluster) pid(n int) (int, error) {
	state := os.Getenv("NOLOCK_STATE")
	if state == "" {
		state = "/var/tmp/nolock"
	}
	b, err := os.ReadFile(filepath.Join(state, fmt.Sprintf("kafka3-%d.pid", n)))
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("pid file: %w", err)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !alive(pid) {
		return 0, fmt.Errorf("pid %d is not running", pid)
	}
	if want := fmt.Sprintf("kafka3-%d/server.properties", n); !strings.Contains(string(cmdline), want) {
		return 0, fmt.Errorf("pid %d is not kafka3 node %d", pid, n)
	}
	c, err := net.DialTimeout("tcp", k.brokers[n-1], time.Second)
	if err != nil {
		return 0, fmt.Errorf("pid %d runs, its port does not answer: %w", pid, err)
	}
	c.Close()
	return pid, nil
}

// alive reports whether pid names a process that has not ended (a zombie
// has).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// script runs scripts/services kafka3 <cmd> <n>.
func (k *KafkaCluster) script(cmd string, n int) ([]byte, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	c := exec.Command(filepath.Join(root, "scripts", "services"), "kafka3", cmd, strconv.Itoa(n))
	c.Dir = root
	return c.CombinedOutput()
}

// moduleRoot returns the directory of the go.mod above the working
// directory (a test runs in its package's directory).
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testenv: no go.mod above the working directory")
		}
		dir = parent
	}
}

// acquire takes the fault lock shared by every test of the cluster, in
// every process, waiting for it as long as Until does.
func (k *KafkaCluster) acquire() {
	k.t.Helper()
	if k.lock != nil {
		return
	}
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "nolock-kafka3.lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		k.t.Fatalf("testenv: kafka3 lock: %v", err)
	}
	// Another test holds it for one kill and restart at most: on a busy
	// machine a JVM's start alone took up to a minute.
	wait := Scale(5 * time.Minute)
	for deadline := time.Now().Add(wait); ; time.Sleep(10 * time.Millisecond) {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			k.t.Fatalf("testenv: the kafka3 fault lock (held by another test killing a node), waited %v: %v", wait, err)
		}
	}
	k.lock = f
}

// release releases the fault lock, if held.
func (k *KafkaCluster) release() {
	if k.lock != nil {
		k.lock.Close() // closing the file releases its lock
		k.lock = nil
	}
}
