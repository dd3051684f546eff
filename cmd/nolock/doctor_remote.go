package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/segmentio/kafka-go"
)

// checkKafka reports the cluster's brokers and, for each topic named, its
// partitions, replication and min.insync.replicas.
func checkKafka(ctx context.Context, brokers, topics []string) []finding {
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: tr}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
	if err != nil {
		return []finding{{Area: "kafka", Status: fail, Detail: fmt.Sprintf("cannot read metadata from %s: %v", strings.Join(brokers, ","), err),
			Fix: "check -kafka (host:port of any broker) and the network"}}
	}
	fs := []finding{{Area: "kafka", Status: pass, Detail: fmt.Sprintf("%d broker(s), controller %d", len(md.Brokers), md.Controller.ID)}}
	minISR := minInsync(ctx, client, topics)
	for _, t := range md.Topics {
		fs = append(fs, topicFinding(t, len(md.Brokers), minISR[t.Name]))
	}
	return fs
}

// minInsync returns each topic's min.insync.replicas (0 when unreadable).
func minInsync(ctx context.Context, client *kafka.Client, topics []string) map[string]int {
	m := map[string]int{}
	if len(topics) == 0 {
		return m
	}
	req := &kafka.DescribeConfigsRequest{}
	for _, t := range topics {
		req.Resources = append(req.Resources, kafka.DescribeConfigRequestResource{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: t, ConfigNames: []string{"min.insync.replicas"}})
	}
	res, err := client.DescribeConfigs(ctx, req)
	if err != nil {
		return m
	}
	for _, r := range res.Resources {
		for _, e := range r.ConfigEntries {
			var n int
			if _, err := fmt.Sscan(e.ConfigValue, &n); err == nil {
				m[r.ResourceName] = n
			}
		}
	}
	return m
}

func topicFinding(t kafka.Topic, brokers, minISR int) finding {
	f := finding{Area: "kafka", Status: pass}
	if t.Error != nil {
		f.Status, f.Detail = fail, fmt.Sprintf("topic %q: %v", t.Name, t.Error)
		f.Fix = "create the topic, or correct -topic"
		return f
	}
	rf, short, leaderless := 0, 0, 0
	for i, p := range t.Partitions {
		if i == 0 || len(p.Replicas) < rf {
			rf = len(p.Replicas)
		}
		if len(p.Isr) < len(p.Replicas) {
			short++
		}
		if p.Leader.Host == "" {
			leaderless++
		}
	}
	f.Detail = fmt.Sprintf("topic %q: %d partitions, replication %d, min.insync.replicas %d", t.Name, len(t.Partitions), rf, minISR)
	switch {
	case leaderless > 0:
		f.Status, f.Detail = fail, f.Detail+fmt.Sprintf(", %d without a leader", leaderless)
		f.Fix = "bring the brokers holding those partitions back"
	case short > 0:
		f.Status, f.Detail = warn, f.Detail+fmt.Sprintf(", %d under-replicated", short)
		f.Fix = "bring the lagging replicas back in sync"
	case rf < 3 || minISR < 2:
		f.Status = warn
		f.Detail += ": a broker's loss can lose acknowledged messages or stop writes"
		if brokers >= 3 {
			f.Fix = "replicate the topic 3 times with min.insync.replicas 2, and produce with acks=all"
		} else {
			f.Fix = fmt.Sprintf("fine for a test bed; production wants 3 brokers, replication 3, min.insync.replicas 2 (this cluster has %d)", brokers)
		}
	}
	return f
}

// checkDynamoDB reports whether the endpoint answers and, for each table
// named, its status, key schema and time to live.
func checkDynamoDB(ctx context.Context, endpoint string, tables []string) []finding {
	client, err := dynamoClient(ctx, endpoint)
	if err != nil {
		return []finding{{Area: "dynamodb", Status: fail, Detail: "AWS configuration: " + err.Error(), Fix: "set AWS_REGION and credentials as the SDK reads them"}}
	}
	if _, err := client.ListTables(ctx, &dynamodb.ListTablesInput{Limit: aws.Int32(1)}); err != nil {
		return []finding{{Area: "dynamodb", Status: fail, Detail: fmt.Sprintf("%s does not answer ListTables: %v", endpoint, err),
			Fix: "check -dynamodb, the credentials and the role's dynamodb:ListTables permission"}}
	}
	fs := []finding{{Area: "dynamodb", Status: pass, Detail: endpoint + " answers"}}
	for _, name := range tables {
		fs = append(fs, tableFinding(ctx, client, name))
	}
	return fs
}

func tableFinding(ctx context.Context, client *dynamodb.Client, name string) finding {
	f := finding{Area: "dynamodb", Status: pass}
	out, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)})
	if err != nil {
		f.Status, f.Detail, f.Fix = fail, fmt.Sprintf("table %q: %v", name, err), "create it: `nolock schema dynamodb` prints the commands"
		return f
	}
	var keys []string
	for _, k := range out.Table.KeySchema {
		keys = append(keys, fmt.Sprintf("%s %s", aws.ToString(k.AttributeName), k.KeyType))
	}
	f.Detail = fmt.Sprintf("table %q: %s, key %s", name, out.Table.TableStatus, strings.Join(keys, ", "))
	if out.Table.TableStatus != types.TableStatusActive {
		f.Status, f.Fix = warn, "wait until the table is ACTIVE"
	}
	if ttl, err := client.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(name)}); err == nil && ttl.TimeToLiveDescription != nil {
		f.Detail += fmt.Sprintf(", time to live %s", ttl.TimeToLiveDescription.TimeToLiveStatus)
	}
	return f
}

// dynamoClient builds a client from the SDK's standard configuration,
// aimed at endpoint. A loopback endpoint (a local server) with neither
// AWS_ACCESS_KEY_ID nor AWS_PROFILE set gets fixed test credentials.
func dynamoClient(ctx context.Context, endpoint string) (*dynamodb.Client, error) {
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, err
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	if os.Getenv("AWS_ACCESS_KEY_ID") == "" && os.Getenv("AWS_PROFILE") == "" && isLoopback(endpoint) {
		cfg.Credentials = aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "nolock doctor"}, nil
		})
	}
	return dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		o.BaseEndpoint = aws.String(endpoint)
		o.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}), nil
}

func isLoopback(endpoint string) bool {
	for _, h := range []string{"//127.", "//localhost", "//[::1]"} {
		if strings.Contains(endpoint, h) {
			return true
		}
	}
	return false
}
