package nolock_test

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/nolock/nolock"

// The clients' import path prefixes.
const (
	awsSDK = "github.com/aws/"
	pgx    = "github.com/jackc/pgx"
)

// The packages by the backend they talk to, relative to the module. A
// program that imports only packages of one side must compile nothing of
// the other side's client.
var (
	// postgresSide compiles no AWS SDK package.
	postgresSide = []string{
		"cas/pgcas", "conditional", "idempotency", "inbox", "partition", "lease", "pgoutcome",
		"internal/pgarg", "internal/pgerr", "internal/pgmode", "internal/pgschema",
	}
	// dynamoSide compiles no pgx package.
	dynamoSide = []string{
		"cas/dynamocas", "conditional/dynamoconditional", "idempotency/dynamoidempotency", "dynamolock",
		"internal/ddbarg", "internal/ddberr",
	}
	// neitherSide is what both sides share: it compiles neither client.
	// "" is the root package, which holds only the overview.
	neitherSide = []string{
		"", "cas", "internal/casstore", "internal/condcore", "internal/idemrecord",
		"internal/backoff", "internal/combine", "internal/outcome", "observe", "internal/notify",
	}
)

// TestBackendsDoNotLeak runs go list -deps for each package above and
// fails when a PostgreSQL-side package compiles an AWS SDK package, a
// DynamoDB-side package compiles pgx, or a shared package compiles either.
// Test files are not counted: a test may use both backends.
func TestBackendsDoNotLeak(t *testing.T) {
	for _, side := range []struct {
		name      string
		pkgs      []string
		forbidden []string
	}{
		{"PostgreSQL", postgresSide, []string{awsSDK}},
		{"DynamoDB", dynamoSide, []string{pgx}},
		{"shared", neitherSide, []string{awsSDK, pgx}},
	} {
		for _, pkg := range side.pkgs {
			path, name := module+"/"+pkg, pkg
			if pkg == "" {
				path, name = module, "root"
			}
			t.Run(side.name+"/"+name, func(t *testing.T) {
				t.Parallel()
				deps := goList(t, "-deps", path)
				for _, prefix := range side.forbidden {
					var leaked []string
					for _, dep := range deps {
						if strings.HasPrefix(dep, prefix) {
							leaked = append(leaked, dep)
						}
					}
					if len(leaked) > 0 {
						t.Errorf("%s (%s side) compiles %d packages under %s, e.g. %s",
							path, side.name, len(leaked), prefix, leaked[0])
					}
				}
			})
		}
	}
}

// TestEveryPublicPackageHasASide keeps the lists above complete: a new
// public package must be put on a side to be checked.
func TestEveryPublicPackageHasASide(t *testing.T) {
	known := slices.Concat(postgresSide, dynamoSide, neitherSide)
	for _, path := range goList(t, "./...") {
		pkg := strings.TrimPrefix(strings.TrimPrefix(path, module), "/")
		top, _, _ := strings.Cut(pkg, "/")
		if top == "internal" || top == "cmd" || top == "examples" {
			continue
		}
		if !slices.Contains(known, pkg) {
			t.Errorf("package %s is on no side: add it to postgresSide, dynamoSide or neitherSide in this file", path)
		}
	}
}

// goList runs go list with args in the module's root and returns the
// import paths it prints.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		var stderr string
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return strings.Fields(string(out))
}
