package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/dynamocas"
	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/idempotency/dynamoidempotency"
	"github.com/nolock/nolock/internal/services"
	"github.com/nolock/nolock/internal/testenv"
)

// postgresTables are the tables of every package, with default names.
var postgresTables = []string{
	"nolock_stock", "nolock_accounts", "nolock_holds", // conditional
	"nolock_cas",                                                                              // cas
	"nolock_idempotency",                                                                      // idempotency
	"nolock_inbox", "nolock_inbox_watermarks", "nolock_inbox_attempts", "nolock_inbox_parked", // inbox
	"nolock_partition", "nolock_partition_parked", // partition
	"nolock_lease", // lease
}

// nolock schema names every package's tables and every DynamoDB-backed
// type, and each part alone prints only its own kind.
func TestSchemaNamesEveryTable(t *testing.T) {
	code, all, stderr := runArgs(t, "schema")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, name := range postgresTables {
		if !strings.Contains(all, `CREATE TABLE IF NOT EXISTS "`+name+`"`) {
			t.Errorf("nolock schema does not create %s", name)
		}
	}
	for _, tbl := range dynamoTables() {
		if !strings.Contains(all, "-- # "+tbl.typ+":") {
			t.Errorf("nolock schema has no DynamoDB table for %s", tbl.typ)
		}
	}
	_, pg, _ := runArgs(t, "schema", "postgres")
	_, ddb, _ := runArgs(t, "schema", "dynamodb")
	if strings.Contains(pg, "aws dynamodb") || !strings.Contains(pg, "nolock_partition") {
		t.Errorf("nolock schema postgres: want the DDL alone:\n%s", pg)
	}
	if strings.Contains(ddb, "CREATE TABLE") || strings.Count(ddb, "aws dynamodb create-table --cli-input-json '") != len(dynamoTables()) {
		t.Errorf("nolock schema dynamodb: want one create-table per type and no DDL:\n%s", ddb)
	}
}

// The printed output applies cleanly to an empty schema, twice (it is
// idempotent, and the DynamoDB part is commented out), and creates every
// table; with -partitioned, the idempotency and inbox tables partitioned.
func TestSchemaApplies(t *testing.T) {
	for _, partitioned := range []bool{false, true} {
		t.Run(fmt.Sprint("partitioned=", partitioned), func(t *testing.T) {
			var out bytes.Buffer
			if err := schema(&out, partitioned); err != nil {
				t.Fatal(err)
			}
			pool := testenv.Postgres(t)
			ctx := context.Background()
			for i := 0; i < 2; i++ {
				if _, err := pool.Exec(ctx, out.String()); err != nil {
					t.Fatalf("applying the schema (pass %d): %v", i+1, err)
				}
			}
			for _, name := range postgresTables {
				var kind string
				if err := pool.QueryRow(ctx, `SELECT coalesce((SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)), '')`, name).Scan(&kind); err != nil {
					t.Fatal(err)
				}
				want := "r"
				if partitioned && (name == "nolock_idempotency" || name == "nolock_inbox") {
					want = "p"
				}
				if kind != want {
					t.Errorf("table %s: relkind %q, want %q", name, kind, want)
				}
			}
		})
	}
}

// Each DynamoDB table definition, created from the printed JSON (renamed),
// serves its type: one write and one read through the library.
func TestDynamoSchemaServesEachType(t *testing.T) {
	ctx := context.Background()
	plain, tx := testenv.DynamoDB(t), testenv.DynamoDBTx(t)
	create := func(t *testing.T, client *dynamodb.Client, tbl dynamoTable) string {
		js, err := tbl.createTableInput()
		if err != nil {
			t.Fatal(err)
		}
		var in dynamodb.CreateTableInput
		if err := json.Unmarshal(js, &in); err != nil {
			t.Fatalf("%s: the JSON does not read as CreateTableInput: %v", js, err)
		}
		name := testenv.Name(tbl.table)
		in.TableName = &name
		if _, err := client.CreateTable(ctx, &in); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { services.DeleteTable(context.Background(), client, name) })
		testenv.Until(t, "table "+name+" active", func() (bool, error) {
			out, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &name})
			return err == nil && out.Table.TableStatus == types.TableStatusActive, nil
		})
		return name
	}
	use := map[string]func(t *testing.T, table string) error{
		"dynamolock.Client": func(t *testing.T, table string) error {
			c, err := dynamolock.New(plain, table)
			if err != nil {
				return err
			}
			defer c.Close()
			l, err := c.TryAcquire(ctx, "job")
			if err != nil {
				return err
			}
			return l.Release(ctx)
		},
		"dynamoconditional.Stock": func(t *testing.T, table string) error {
			s, err := dynamoconditional.NewStock(plain, table)
			if err != nil {
				return err
			}
			if err := s.Put(ctx, "sku", 2); err != nil {
				return err
			}
			return s.Take(ctx, "sku", 1)
		},
		"dynamoconditional.Accounts": func(t *testing.T, table string) error {
			a, err := dynamoconditional.NewAccounts(plain, table)
			if err != nil {
				return err
			}
			if err := a.Open(ctx, "wallet", 10); err != nil {
				return err
			}
			return a.Debit(ctx, "wallet", 3)
		},
		"dynamoconditional.Holds": func(t *testing.T, table string) error {
			h, err := dynamoconditional.NewHolds(plain, table)
			if err != nil {
				return err
			}
			if err := h.Add(ctx, "seat-1"); err != nil {
				return err
			}
			_, err = h.Hold(ctx, "seat-1", "ann", time.Minute)
			return err
		},
		"dynamocas.Backend": func(t *testing.T, table string) error {
			b, err := dynamocas.NewBackend(plain, table)
			if err != nil {
				return err
			}
			s, err := cas.NewStore[int64](b, nil)
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.Create(ctx, "n", 1); err != nil {
				return err
			}
			_, err = s.Update(ctx, "n", func(n int64) (int64, error) { return n + 1, nil })
			return err
		},
		"dynamoidempotency.Store": func(t *testing.T, table string) error {
			d, err := dynamoidempotency.New(tx, table)
			if err != nil {
				return err
			}
			_, err = d.Do(ctx, "payments", "key-1", nil, func(context.Context) ([]types.TransactWriteItem, []byte, error) {
				return nil, []byte("ok"), nil
			})
			return err
		},
	}
	for _, tbl := range dynamoTables() {
		t.Run(tbl.typ, func(t *testing.T) {
			f, ok := use[tbl.typ]
			if !ok {
				t.Fatalf("no check for %s", tbl.typ)
			}
			client := plain
			if tbl.typ == "dynamoidempotency.Store" {
				client = tx
			}
			if err := f(t, create(t, client, tbl)); err != nil {
				t.Fatalf("%s on the printed table: %v", tbl.typ, err)
			}
		})
	}
}
