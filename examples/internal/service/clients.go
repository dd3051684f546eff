package service

import (
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Postgres opens a pool on DATABASE_URL (a libpq URL or key=value string;
// pgx reads the PG* variables for what it leaves out), checks it answers,
// registers its health check ("postgres": a ping) and closes it at the
// end. It exits 1 when the database does not answer.
func (s *Service) Postgres() *pgxpool.Pool {
	s.Require("DATABASE_URL")
	pool, err := pgxpool.New(s.ctx, s.Env("DATABASE_URL", ""))
	if err == nil {
		err = pool.Ping(s.ctx)
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		s.Fatal(fmt.Errorf("DATABASE_URL: %w", err))
	}
	s.OnStop(func() error { pool.Close(); return nil })
	s.Check("postgres", pool.Ping)
	return pool
}

// Brokers returns KAFKA_BROKERS, comma-separated host:port.
func (s *Service) Brokers() []string {
	s.Require("KAFKA_BROKERS")
	return strings.Split(s.Env("KAFKA_BROKERS", ""), ",")
}

// AWS loads the AWS configuration the standard way
// (config.LoadDefaultConfig): AWS_REGION, AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY or a profile or a role, and AWS_ENDPOINT_URL (or
// AWS_ENDPOINT_URL_DYNAMODB) for a DynamoDB-compatible server elsewhere
// than AWS. It exits 2 when no region is configured.
func (s *Service) AWS() aws.Config {
	cfg, err := config.LoadDefaultConfig(s.ctx)
	if err != nil {
		s.Usage("AWS configuration: %v", err)
	}
	if cfg.Region == "" {
		s.Usage("AWS_REGION not set")
	}
	return cfg
}
