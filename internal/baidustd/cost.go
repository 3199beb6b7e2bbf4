package baidustd

import (
	"reflect"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/kvcar/kvcar/internal/budget"
)

// decodeCost bounds what decoding a message costs in memory before it is
// decoded: a message's wire form can be far smaller than what it decodes
// to (an empty element of a repeated message field is 2 bytes on the
// wire and a Go struct of a hundred or more bytes), so a frame within the
// in-flight budget could still take gigabytes once decoded. The bound is
// read off the wire with a tree made once from the message's descriptor:
// every message decoded costs its Go struct, every element a slot of a
// slice that may have doubled, every string and bytes value its length,
// every unknown field its bytes, each rounded up for the allocator.
type decodeCost struct {
	root *costMsg
	// perByte bounds what any wire byte can decode to in this tree: the
	// charge of a message the walk cannot read, which the decode should
	// refuse, in case it does not.
	perByte int64
}

// costMsg is what the walk knows of one message type.
type costMsg struct {
	size int64 // its Go struct, rounded up; 0 for a map's entry
	// fields by number: a slice where the numbers are small, as they
	// are in every message kvcar takes, a map otherwise.
	dense  []*costField
	sparse map[protowire.Number]*costField
}

type costField struct {
	msg   *costMsg // the message (or map entry) it holds; nil for others
	isMap bool
	text  bool // string or bytes
}

// Per-value charges, in bytes: a slot of a repeated field's slice (a
// word, twice for the slice's growth), a string or bytes header in one,
// and what a map entry adds to its key and value.
const (
	slotCost     = 16
	headerCost   = 48
	mapEntryCost = 64
	// mapBaseCost is a map's own table, charged at its first entry in a
	// message: Go's map header and its first group of eight slots (a
	// one-entry map[string]string took 512 bytes against 397 charged
	// without it).
	mapBaseCost = 320
	// maxCostDepth stops the walk where proto.Unmarshal's default
	// recursion limit stops the decode.
	maxCostDepth = 10000
	// maxDenseField is the highest field number kept in a slice.
	maxDenseField = 256
)

// newDecodeCost makes the tree of md and of every message it can hold.
func newDecodeCost(md protoreflect.MessageDescriptor) *decodeCost {
	seen := make(map[protoreflect.FullName]*costMsg)
	c := &decodeCost{root: costTree(md, seen), perByte: max(slotCost, headerCost/2)}
	for _, m := range seen {
		// An element of it is at least 2 bytes: its tag and a zero length.
		c.perByte = max(c.perByte, (m.size+slotCost+mapEntryCost)/2)
	}
	return c
}

func costTree(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]*costMsg) *costMsg {
	if m := seen[md.FullName()]; m != nil {
		return m
	}
	m := &costMsg{}
	seen[md.FullName()] = m
	// A message without a registered Go type (a map's entry) is charged
	// by its fields alone.
	if mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName()); err == nil {
		m.size = budget.AllocSize(int64(reflect.TypeOf(mt.New().Interface()).Elem().Size()))
	}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		f := &costField{isMap: fd.IsMap(), text: fd.Kind() == protoreflect.StringKind || fd.Kind() == protoreflect.BytesKind}
		if fd.Message() != nil {
			f.msg = costTree(fd.Message(), seen)
		}
		if n := fd.Number(); n <= maxDenseField {
			if int(n) >= len(m.dense) {
				m.dense = append(m.dense, make([]*costField, int(n)+1-len(m.dense))...)
			}
			m.dense[n] = f
		} else {
			if m.sparse == nil {
				m.sparse = make(map[protowire.Number]*costField)
			}
			m.sparse[n] = f
		}
	}
	return m
}

func (m *costMsg) field(n protowire.Number) *costField {
	if n >= 0 && int(n) < len(m.dense) {
		return m.dense[n]
	}
	return m.sparse[n]
}

// of returns the bound for b decoded as the tree's message. For bytes
// that do not parse as one, which the decode then refuses, it charges
// the most any bytes can cost.
func (c *decodeCost) of(b []byte) int64 {
	if total, ok := c.root.cost(b, 0); ok {
		return total
	}
	return c.root.size + c.perByte*int64(len(b))
}

func (m *costMsg) cost(b []byte, depth int) (int64, bool) {
	if depth > maxCostDepth {
		return 0, false
	}
	total := m.size
	// maps has the bit of each map field below 64 whose table has been
	// charged; one of a higher number is charged at every entry.
	var maps uint64
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false
		}
		l := protowire.ConsumeFieldValue(num, typ, b[n:])
		if l < 0 {
			return 0, false
		}
		val := b[n : n+l]
		b = b[n+l:]
		f := m.field(num)
		if f == nil {
			total += 2 * int64(n+l) // kept as unknown bytes, in a growing slice
			continue
		}
		cost, ok := f.cost(num, typ, val, 2*int64(n+l), depth)
		if !ok {
			return 0, false
		}
		if f.isMap && (num >= 64 || maps&(1<<num) == 0) {
			cost += mapBaseCost
			if num < 64 {
				maps |= 1 << num
			}
		}
		total += cost
	}
	return total, true
}

// cost is the bound for one occurrence of f on the wire, its value val
// of wire type typ; raw is what the occurrence costs kept as unknown
// bytes, as the decode keeps a scalar whose wire type is not its field's.
func (f *costField) cost(num protowire.Number, typ protowire.Type, val []byte, raw int64, depth int) (int64, bool) {
	switch typ {
	case protowire.StartGroupType:
		inner, n := protowire.ConsumeGroup(num, val)
		if n < 0 || f.msg == nil {
			return 2 * int64(len(val)), n >= 0
		}
		cost, ok := f.msg.cost(inner, depth+1)
		return cost + slotCost, ok
	case protowire.BytesType:
	default:
		return max(slotCost, raw), true // one scalar
	}
	inner, n := protowire.ConsumeBytes(val)
	if n < 0 {
		return 0, false
	}
	switch {
	case f.msg != nil: // a message, or a map's entry
		cost, ok := f.msg.cost(inner, depth+1)
		if f.isMap {
			cost += mapEntryCost
		}
		return cost + slotCost, ok
	case f.text:
		return headerCost + int64(len(inner)), true
	}
	// A packed run of scalars: every one is at least a byte.
	return slotCost * int64(len(inner)), true
}
