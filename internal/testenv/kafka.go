package testenv

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nolock/nolock/internal/services"
)

// Kafka returns the test brokers (NOLOCK_TEST_KAFKA).
func Kafka(t testing.TB) []string {
	t.Helper()
	return strings.Split(need(t, EnvKafka), ",")
}

// Topic creates a fresh topic with the given number of partitions on the
// test brokers and deletes it when the test ends. It returns the brokers and
// the topic's name once every partition has a leader.
func Topic(t testing.TB, partitions int) ([]string, string) {
	t.Helper()
	brokers := Kafka(t)
	topic := Name("t")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := services.CreateTopic(ctx, brokers, topic, partitions); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := services.DeleteTopic(ctx, brokers, topic); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
	return brokers, topic
}
