// Package ddbarg checks the arguments nolock's DynamoDB constructors take
// before any I/O: table and attribute names DynamoDB would refuse or
// confuse, and clients that are not nil. Its errors name the parameter and
// say what is wrong; each package wraps them in its own invalid-argument
// error.
package ddbarg

import (
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nolock/nolock/internal/errfmt"
)

// Limits of DynamoDB's names.
const (
	// MinTableLen and MaxTableLen bound a table name's length.
	MinTableLen, MaxTableLen = 3, 255
	// MaxTableARNLen bounds a table given by its ARN.
	MaxTableARNLen = 1024
	// MaxKeyAttrLen bounds the name of a key attribute (partition or sort
	// key) in bytes.
	MaxKeyAttrLen = 255
	// MaxAttrLen bounds the name of any other attribute in bytes.
	MaxAttrLen = 64 << 10
)

// Table checks name, passed as the parameter param, as a table name: 3 to
// 255 characters of a-z, A-Z, 0-9, '_', '-' and '.', or a table ARN
// ("arn:…", at most 1024 bytes of printable ASCII).
func Table(param, name string) error {
	if strings.HasPrefix(name, "arn:") {
		if len(name) > MaxTableARNLen {
			return errfmt.Errorf("%s is an ARN of %d bytes, more than %d", param, len(name), MaxTableARNLen)
		}
		for i := 0; i < len(name); i++ {
			if name[i] <= ' ' || name[i] > '~' {
				return errfmt.Errorf("%s is an ARN with byte %#x at %d, not printable ASCII", param, name[i], i)
			}
		}
		return nil
	}
	switch {
	case name == "":
		return errfmt.Errorf("%s is empty", param)
	case len(name) < MinTableLen || len(name) > MaxTableLen:
		return errfmt.Errorf("%s is %d bytes; DynamoDB takes %d to %d", param, len(name), MinTableLen, MaxTableLen)
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-', c == '.':
		default:
			return errfmt.Errorf("%s has %q at byte %d; DynamoDB takes only a-z, A-Z, 0-9, '_', '-' and '.'", param, c, i)
		}
	}
	return nil
}

// Attr checks name, passed as the parameter param, as an attribute name of
// at most max bytes (MaxKeyAttrLen for a key attribute, MaxAttrLen for
// others): non-empty and valid UTF-8, since the SDK's JSON encoding turns
// every invalid byte into U+FFFD and two different names would then
// address one attribute.
func Attr(param, name string, max int) error {
	switch {
	case name == "":
		return errfmt.Errorf("%s is empty", param)
	case len(name) > max:
		return errfmt.Errorf("%s is %d bytes, more than %d", param, len(name), max)
	case !utf8.ValidString(name):
		return errfmt.Errorf("%s is not valid UTF-8", param)
	}
	return nil
}

// KeyAttributes checks the names WithKeyAttributes gives: a partition key
// attribute, and a sort key attribute unless sort is "" (none), each a
// valid key attribute name, the two distinct, neither one of own (the
// item's other attributes).
func KeyAttributes(partition, sort string, own ...string) error {
	if err := Attr("partition key attribute", partition, MaxKeyAttrLen); err != nil {
		return err
	}
	if sort != "" {
		if err := Attr("sort key attribute", sort, MaxKeyAttrLen); err != nil {
			return err
		}
		if sort == partition {
			return errfmt.Errorf("sort key attribute and partition key attribute are both %q", partition)
		}
	}
	for _, name := range []string{partition, sort} {
		if slices.Contains(own, name) {
			return errfmt.Errorf("key attribute %q is one of the item's own attributes", name)
		}
	}
	return nil
}

// NilClient reports whether client is nil or holds a nil *dynamodb.Client.
func NilClient(client any) bool {
	switch v := client.(type) {
	case nil:
		return true
	case *dynamodb.Client:
		return v == nil
	}
	return false
}
