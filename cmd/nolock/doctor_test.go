package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nolock/nolock/internal/testenv"
)

// doctorFindings runs nolock doctor with args and -json and returns its
// exit status and findings.
func doctorFindings(t *testing.T, args ...string) (int, []finding) {
	t.Helper()
	code, stdout, stderr := runArgs(t, append([]string{"doctor", "-json"}, args...)...)
	var fs []finding
	if err := json.Unmarshal([]byte(stdout), &fs); err != nil {
		t.Fatalf("exit %d, output is not JSON (%v):\n%s\n%s", code, err, stdout, stderr)
	}
	return code, fs
}

// find returns the findings of area whose detail contains text.
func find(fs []finding, area, text string) []finding {
	var out []finding
	for _, f := range fs {
		if f.Area == area && strings.Contains(f.Detail, text) {
			out = append(out, f)
		}
	}
	return out
}

// want fails the test unless exactly one finding of area contains text,
// with status.
func want(t *testing.T, fs []finding, area, text, status string) finding {
	t.Helper()
	got := find(fs, area, text)
	if len(got) != 1 || got[0].Status != status {
		t.Fatalf("want one %s finding %q with status %s; all findings: %+v", area, text, status, fs)
	}
	return got[0]
}

// The doctor tells a direct connection from PgBouncer in transaction
// pooling, and judges pgx's mode there as docs/deploying.md does.
func TestDoctorPostgres(t *testing.T) {
	t.Parallel()
	direct := testenv.PostgresDSN(t)
	code, fs := doctorFindings(t, "-postgres", direct)
	if code != 0 {
		t.Fatalf("exit %d on the test server: %+v", code, fs)
	}
	want(t, fs, "pooler", "none", pass)
	want(t, fs, "durability", "synchronous_commit on", pass)
	want(t, fs, "isolation", "read committed", pass)

	bouncer := testenv.PgBouncerDSN(t)
	_, fs = doctorFindings(t, "-postgres", bouncer)
	f := want(t, fs, "pooler", "pool_mode transaction", warn)
	if !strings.Contains(f.Fix, "default_query_exec_mode=exec") {
		t.Errorf("the fix does not name the mode to set: %+v", f)
	}
	_, fs = doctorFindings(t, "-postgres", withParam(bouncer, "default_query_exec_mode=exec"))
	want(t, fs, "pooler", "pgx mode exec", pass)

	// nolock's tables show up with their sizes and upkeep: records expired
	// long ago and parked messages warn; a lease's rows never expire away.
	pool, schema := testenv.PostgresSchema(t, 2)
	if _, err := pool.Exec(context.Background(), `
		CREATE TABLE nolock_probe (k int);
		CREATE TABLE nolock_records (expires_at timestamptz);
		INSERT INTO nolock_records VALUES (now() - interval '2 hours'), (now() + interval '1 hour');
		CREATE TABLE nolock_fresh (expires_at timestamptz);
		INSERT INTO nolock_fresh VALUES (now() - interval '1 minute');
		CREATE TABLE nolock_locks (expires_at timestamptz, token bigint);
		INSERT INTO nolock_locks VALUES (now() - interval '2 days', 7);
		CREATE TABLE nolock_parked (parked_at timestamptz);
		INSERT INTO nolock_parked VALUES (now() - interval '3 minutes'), (now());
		CREATE TABLE nolock_ids (processed_at timestamptz);
		INSERT INTO nolock_ids VALUES (now() - interval '1 day')`); err != nil {
		t.Fatal(err)
	}
	_, fs = doctorFindings(t, "-postgres", testenv.PostgresDSNFor(t, schema))
	want(t, fs, "tables", schema+".nolock_probe (", pass)
	want(t, fs, "tables", "nolock_records (", warn)
	want(t, fs, "tables", "the oldest expired 2h0m", warn)
	want(t, fs, "tables", "nolock_fresh (", pass)
	want(t, fs, "tables", "nolock_locks (", pass)
	want(t, fs, "tables", "2 parked message(s), the oldest parked 3m", warn)
	want(t, fs, "tables", "the oldest message id kept is 24h0m", pass)
}

// Beside a synchronous standby the doctor reports it, and a DSN that
// reaches the standby fails: it refuses writes.
func TestDoctorStandby(t *testing.T) {
	t.Parallel()
	pair := testenv.PostgresPair(t)
	code, fs := doctorFindings(t, "-postgres", pair.PrimaryDSN())
	if code != 0 {
		t.Fatalf("exit %d on the primary: %+v", code, fs)
	}
	want(t, fs, "durability", "1 of 1 replicas synchronous", pass)
	code, fs = doctorFindings(t, "-postgres", pair.StandbyDSN())
	if code != 1 {
		t.Fatalf("exit %d on the standby, want 1: %+v", code, fs)
	}
	want(t, fs, "postgres", "a standby", fail)
}

// Kafka topics and DynamoDB tables that do not exist fail; what exists
// is described.
func TestDoctorKafkaDynamoDB(t *testing.T) {
	t.Parallel()
	brokers, topic := testenv.Topic(t, 3)
	ddb := testenv.DynamoDBEndpoint(t)
	table := testenv.Table(t, testenv.DynamoDB(t), false)
	code, fs := doctorFindings(t, "-postgres", testenv.PostgresDSN(t), "-kafka", strings.Join(brokers, ","),
		"-topic", topic+",nolock_doctor_absent", "-dynamodb", ddb, "-dynamodb-table", table+",nolock_doctor_absent")
	if code != 1 {
		t.Fatalf("exit %d, want 1 (absent topic and table): %+v", code, fs)
	}
	want(t, fs, "kafka", "topic \""+topic+"\": 3 partitions", warn) // one broker: replication 1
	want(t, fs, "kafka", "nolock_doctor_absent", fail)
	want(t, fs, "dynamodb", "table \""+table+"\": ACTIVE", pass)
	want(t, fs, "dynamodb", "nolock_doctor_absent", fail)
}

func withParam(dsn, param string) string {
	if strings.Contains(dsn, "?") {
		return dsn + "&" + param
	}
	return dsn + "?" + param
}

// On the three-broker cluster a topic replicated three times with
// min.insync.replicas 2 passes; with a broker down its partitions are
// under-replicated and the doctor says so.
func TestDoctorKafkaCluster(t *testing.T) {
	k := testenv.Kafka3(t)
	k.Lock()
	topic := k.CreateTopic(3)
	brokers := strings.Join(k.Brokers(), ",")
	_, fs := doctorFindings(t, "-postgres", testenv.PostgresDSN(t), "-kafka", brokers, "-topic", topic)
	want(t, fs, "kafka", "3 broker(s)", pass)
	want(t, fs, "kafka", "replication 3, min.insync.replicas 2", pass)
	k.Kill(3)
	defer k.Start(3)
	_, fs = doctorFindings(t, "-postgres", testenv.PostgresDSN(t), "-kafka", brokers, "-topic", topic)
	want(t, fs, "kafka", "under-replicated", warn)
}
