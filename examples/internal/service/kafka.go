package service

import "strings"

// Brokers returns KAFKA_BROKERS, comma-separated host:port; it exits 2
// when the variable is not set.
func (s *Service) Brokers() []string {
	s.Require("KAFKA_BROKERS")
	return strings.Split(s.Env("KAFKA_BROKERS", ""), ",")
}
