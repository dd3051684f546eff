package nolockotel_test

import (
	osexec "os/exec"
	"strings"
	"testing"
)

// The adapter compiles no AWS SDK (a PostgreSQL-only program that uses it
// stays free of one) and none of the DynamoDB packages: ErrorType names
// their sentinels by text.
func TestNoDynamoDBDependency(t *testing.T) {
	t.Parallel()
	out, err := osexec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.Contains(pkg, "github.com/aws/") || strings.Contains(pkg, "/dynamo") {
			t.Errorf("nolockotel depends on %s", pkg)
		}
	}
}
