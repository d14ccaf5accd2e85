package cuda

import (
	"strings"
	"testing"
)

// TestFitsDevice checks the check New makes before uploading: Flash q2's
// weights (86,720,105,792 bytes, ds4-gguf synth --flash-q2) are refused on
// an 80 GB H100's free memory with the sizes named, taken on an H200's, a
// model that fills the free memory to within the staging buffer refused,
// and a device that reports no free memory not checked.
func TestFitsDevice(t *testing.T) {
	const q2 = 86720105792
	h100 := Info{Name: "NVIDIA H100 80GB HBM3", FreeMem: 84_460_000_000, TotalMem: 85_030_000_000}
	err := fitsDevice(q2, h100)
	if err == nil {
		t.Fatal("Flash q2 on an H100: no error")
	}
	for _, s := range []string{"80.8 GiB", "NVIDIA H100 80GB HBM3", "78.7 GiB free", "79.2 GiB", "CPU backend"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	h200 := Info{Name: "NVIDIA H200", FreeMem: 150_000_000_000, TotalMem: 150_700_000_000}
	if err := fitsDevice(q2, h200); err != nil {
		t.Errorf("Flash q2 on an H200: %v", err)
	}
	if err := fitsDevice(int64(h200.FreeMem)-stagingBytes+1, h200); err == nil {
		t.Error("weights that leave less than the staging buffer free: no error")
	}
	if err := fitsDevice(q2, Info{Name: "unknown"}); err != nil {
		t.Errorf("no free memory reported: %v", err)
	}
}

// TestNewRefusesWhatDoesNotFit runs the check on the device: with all but
// half of a small model's bytes (plus the staging buffer) taken by another
// allocation, New must refuse the model before uploading anything, naming
// the device; with that memory free again, the same model loads.
func TestNewRefusesWhatDoesNotFit(t *testing.T) {
	d := gpu(t)
	_, w := flashLayers4(t)
	need := w.Bytes()
	free := int64(d.Info().FreeMem)
	if free <= 0 {
		t.Skip("the library reports no free memory")
	}
	hog, err := d.Malloc(free - stagingBytes - need/2)
	if err != nil {
		t.Fatalf("taking %d of %d free bytes: %v", free-stagingBytes-need/2, free, err)
	}
	left := int64(d.Info().FreeMem)
	be, err := New(w, Options{})
	if err == nil {
		be.Close()
		d.Free(hog)
		t.Fatalf("a %d-byte model with %d bytes free: New did not refuse it", need, left)
	}
	if !strings.Contains(err.Error(), "GiB of device memory") || !strings.Contains(err.Error(), d.Info().Name) {
		t.Errorf("refusal %q does not name the sizes and the device", err)
	}
	t.Logf("%d-byte model, %d bytes free: %v", need, left, err)
	if err := d.Free(hog); err != nil {
		t.Fatal(err)
	}
	testBackend(t, w, Options{}) // fits again
}
