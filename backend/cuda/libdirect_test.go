package cuda

import (
	"strings"
	"testing"
)

// TestDirectCalls checks the bookkeeping of the SyscallN wrappers without a
// GPU (nothing is called): with every symbol present each replaced entry
// point is set; a missing symbol is an error that names it.
func TestDirectCalls(t *testing.T) {
	var l lib
	if err := l.direct(func(string) uintptr { return 1 }); err != nil {
		t.Fatal(err)
	}
	if l.matmulEx == nil || l.quantize == nil || l.moeCombine == nil || l.streamSync == nil || l.graphLaunch == nil {
		t.Fatal("an entry point was not set")
	}
	err := l.direct(func(name string) uintptr {
		if name == "ds4c_topk" {
			return 0
		}
		return 1
	})
	if err == nil || !strings.Contains(err.Error(), "ds4c_topk") {
		t.Fatalf("a missing symbol gave %v", err)
	}
}
