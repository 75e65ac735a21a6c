// Command gencommands writes the typed side-effect methods of the window package (and of the
// Java client) from Redis's own command specification: the COMMAND DOCS and COMMAND INFO
// replies of a real redis-server, captured by ../../rediscommands/capture.sh into
// rediscommands/redis-<version>.json. Nothing about a command is written by hand: its name, its
// arguments, their order, types, tokens and flags all come from that file.
//
//	gencommands -spec SPEC.json -lang go   -out FILE   (package window: commands_gen.go)
//	gencommands -spec SPEC.json -lang java -out FILE   (dev.windowsidecar.client.RedisCommands)
//
// The commands: those of the data groups (strings, hashes, lists, sets, sorted sets, streams,
// keys, HyperLogLog, geo, bitmaps) that write (COMMAND INFO's `write` flag), plus PUBLISH and
// SPUBLISH; not the blocking ones, not those the sidecar refuses (they could never run in a
// window), not those Redis marks deprecated or as system commands, not container commands
// (with subcommands). Anything else stays reachable with Queue(name, args...).
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"go/format"
	"log"
	"os"
	"sort"
	"strings"
)

type spec struct {
	RedisVersion string                `json:"redis_version"`
	CommandDocs  map[string]commandDoc `json:"command_docs"`
	CommandInfo  []json.RawMessage     `json:"command_info"`
}

type commandDoc struct {
	Summary     string                `json:"summary"`
	Since       string                `json:"since"`
	Group       string                `json:"group"`
	DocFlags    []string              `json:"doc_flags"`
	Arguments   []arg                 `json:"arguments"`
	Subcommands map[string]commandDoc `json:"subcommands"`
}

type arg struct {
	Name      string   `json:"name"`
	Type      string   `json:"type"`
	Token     string   `json:"token"`
	Flags     []string `json:"flags"`
	Arguments []arg    `json:"arguments"`
}

func (a arg) has(flag string) bool {
	for _, f := range a.Flags {
		if f == flag {
			return true
		}
	}
	return false
}

func (a arg) optional() bool { return a.has("optional") }
func (a arg) multiple() bool { return a.has("multiple") }

// groups are the data groups whose write commands are generated.
var groups = map[string]bool{
	"string": true, "hash": true, "list": true, "set": true, "sorted-set": true, "stream": true,
	"generic": true, "hyperloglog": true, "geo": true, "bitmap": true,
}

// refused are the commands the sidecar never runs in a window (server/core/src/window/command.rs):
// a typed method for them could only fail at the flush.
var refused = map[string]bool{
	"blpop": true, "brpop": true, "brpoplpush": true, "blmove": true, "blmpop": true,
	"bzpopmin": true, "bzpopmax": true, "bzmpop": true, "xread": true, "xreadgroup": true,
	"wait": true, "migrate": true, "keys": true, "flushall": true, "flushdb": true, "swapdb": true,
}

// command is one generated command.
type command struct {
	Name string // lower case, as COMMAND DOCS keys it
	Doc  commandDoc
}

func selectCommands(s spec) ([]command, error) {
	flags := map[string][]string{}
	for _, raw := range s.CommandInfo {
		var info []json.RawMessage
		if err := json.Unmarshal(raw, &info); err != nil || len(info) < 3 {
			return nil, fmt.Errorf("a COMMAND INFO entry: %s", raw)
		}
		var name string
		var fl []string
		if err := json.Unmarshal(info[0], &name); err != nil {
			return nil, err
		}
		if err := json.Unmarshal(info[2], &fl); err != nil {
			return nil, err
		}
		flags[name] = fl
	}
	var out []command
	for name, doc := range s.CommandDocs {
		fl, ok := flags[name]
		if !ok {
			return nil, fmt.Errorf("%s is in COMMAND DOCS but not in COMMAND INFO", name)
		}
		pubsub := name == "publish" || name == "spublish"
		if !pubsub && (!groups[doc.Group] || !contains(fl, "write")) {
			continue
		}
		if contains(fl, "blocking") || refused[name] || len(doc.Subcommands) > 0 ||
			contains(doc.DocFlags, "deprecated") || contains(doc.DocFlags, "syscmd") ||
			strings.ContainsAny(name, "-|") {
			continue
		}
		out = append(out, command{Name: name, Doc: doc})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// camel makes an identifier part of an argument name: "unix-time-seconds" -> "UnixTimeSeconds".
func camel(s string) string {
	var b strings.Builder
	up := true
	for _, r := range s {
		switch {
		case r == '-' || r == '_' || r == ' ':
			up = true
		case r >= 'a' && r <= 'z' && up:
			b.WriteRune(r - 'a' + 'A')
			up = false
		case (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9'):
			b.WriteRune(r)
			up = false
		}
	}
	return b.String()
}

func lowerFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToLower(s[:1]) + s[1:]
}

// tokenIdent is a token as an identifier part: "MAXLEN" -> "MAXLEN", "~" -> "Approx", …
func tokenIdent(a arg) string {
	t := a.Token
	ok := t != ""
	for _, r := range t {
		if !((r >= 'A' && r <= 'Z') || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9')) {
			ok = false
		}
	}
	if ok {
		return strings.ToUpper(t)
	}
	return camel(a.Name)
}

// syntax renders an argument list the way Redis's documentation does.
func syntax(args []arg) string {
	parts := make([]string, len(args))
	for i, a := range args {
		parts[i] = syntaxOf(a)
	}
	return strings.Join(parts, " ")
}

func syntaxOf(a arg) string {
	var s string
	switch a.Type {
	case "pure-token":
		s = a.Token
		if s == "" {
			s = `""`
		}
	case "block":
		s = syntax(a.Arguments)
	case "oneof":
		alts := make([]string, len(a.Arguments))
		for i, x := range a.Arguments {
			alts[i] = syntaxOf(x)
		}
		s = strings.Join(alts, " | ")
		if !a.optional() {
			s = "<" + s + ">"
		}
	default:
		s = a.Name
		if a.Token != "" {
			s = a.Token + " " + s
		}
	}
	if a.Type != "pure-token" && a.Token != "" && (a.Type == "block" || a.Type == "oneof") {
		s = a.Token + " " + s
	}
	if a.multiple() {
		rep := s
		if a.has("multiple_token") && a.Token != "" && a.Type != "block" && a.Type != "oneof" {
			s = s + " [" + rep + " ...]"
		} else if a.Token != "" && a.Type != "block" && a.Type != "oneof" {
			s = a.Token + " " + a.Name + " [" + a.Name + " ...]"
		} else {
			s = s + " [" + rep + " ...]"
		}
	}
	if a.optional() {
		s = "[" + s + "]"
	}
	return s
}

func main() {
	specFile := flag.String("spec", "", "the captured specification (rediscommands/redis-<version>.json)")
	lang := flag.String("lang", "go", "go or java")
	out := flag.String("out", "", "the file to write")
	flag.Parse()
	if *specFile == "" || *out == "" {
		log.Fatal("usage: gencommands -spec SPEC.json -lang go|java -out FILE")
	}
	raw, err := os.ReadFile(*specFile)
	if err != nil {
		log.Fatal(err)
	}
	var s spec
	if err := json.Unmarshal(raw, &s); err != nil {
		log.Fatalf("%s: %v", *specFile, err)
	}
	cmds, err := selectCommands(s)
	if err != nil {
		log.Fatal(err)
	}
	base := (*specFile)[strings.LastIndex(*specFile, "/")+1:]
	var src []byte
	switch *lang {
	case "go":
		src, err = genGo(s.RedisVersion, base, cmds)
	case "java":
		src, err = genJava(s.RedisVersion, base, cmds)
	default:
		err = fmt.Errorf("unknown language %q", *lang)
	}
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*out, src, 0o644); err != nil {
		log.Fatal(err)
	}
}

// ---- Go -------------------------------------------------------------------------------------

type goGen struct {
	types bytes.Buffer
}

// goKind is how a value of an argument is held and encoded.
type goKind int

const (
	kSimple goKind = iota // string, any, int64, float64
	kBool                 // a pure token
	kBlock                // a struct with an args() method
	kEnum                 // a string type of tokens
	kOneof                // a struct holding encoded arguments, built by constructors
)

// typeOf declares what a's value needs and says how it is held. name is the Go type name a
// declared type gets.
func (g *goGen) typeOf(a arg, name string) (string, goKind) {
	switch a.Type {
	case "key", "pattern":
		return "string", kSimple
	case "string":
		return "any", kSimple
	case "integer", "unix-time":
		return "int64", kSimple
	case "double":
		return "float64", kSimple
	case "pure-token":
		return "bool", kBool
	case "block":
		g.block(a, name)
		return name, kBlock
	case "oneof":
		allTokens := true
		for _, x := range a.Arguments {
			if x.Type != "pure-token" {
				allTokens = false
			}
		}
		if collapsible(a) {
			// Tokens or one string: the string itself ("*" or an id for XADD).
			return "string", kSimple
		}
		if allTokens {
			fmt.Fprintf(&g.types, "// %s is one of %s.\ntype %s string\n\n// The values of %s.\nconst (\n", name, syntaxOf(arg{Type: "oneof", Arguments: a.Arguments}), name, name)
			for _, x := range a.Arguments {
				fmt.Fprintf(&g.types, "\t%s%s %s = %q\n", name, tokenIdent(x), name, x.Token)
			}
			g.types.WriteString(")\n\n")
			return name, kEnum
		}
		fmt.Fprintf(&g.types, "// %s is one of %s: make it with %s….\ntype %s struct{ args []any }\n\n", name, syntaxOf(arg{Type: "oneof", Arguments: a.Arguments}), name, name)
		for _, x := range a.Arguments {
			ctor := name + tokenIdent(x)
			switch x.Type {
			case "pure-token":
				fmt.Fprintf(&g.types, "// %s is %s.\nfunc %s() %s { return %s{[]any{%q}} }\n\n", ctor, x.Token, ctor, name, name, x.Token)
			case "block":
				if flat(x) {
					// The block's arguments are the constructor's parameters.
					fs := g.fields(x.Arguments, ctor, func(y arg) string { return goParam(y.Name) })
					var ps []string
					for _, f := range fs {
						ps = append(ps, f.name+" "+f.typ)
					}
					var body bytes.Buffer
					if x.Token != "" {
						fmt.Fprintf(&body, "\ta = append(a, %q)\n", x.Token)
					}
					for _, f := range fs {
						appendField(&body, f, f.name)
					}
					fmt.Fprintf(&g.types, "// %s is %s.\nfunc %s(%s) %s {\n\tvar a []any\n%s\treturn %s{a}\n}\n\n",
						ctor, syntaxOf(stripFlags(x)), ctor, strings.Join(ps, ", "), name, body.String(), name)
					continue
				}
				bt, _ := g.typeOf(x, name+camel(x.Name)+"Args")
				fmt.Fprintf(&g.types, "// %s is %s.\nfunc %s(v %s) %s {\n\tvar a []any\n", ctor, syntaxOf(stripFlags(x)), ctor, bt, name)
				if x.Token != "" {
					fmt.Fprintf(&g.types, "\ta = append(a, %q)\n", x.Token)
				}
				fmt.Fprintf(&g.types, "\treturn %s{v.appendArgs(a)}\n}\n\n", name)
			default:
				t, _ := g.typeOf(x, "")
				fmt.Fprintf(&g.types, "// %s is %s.\nfunc %s(%s %s) %s {\n\treturn %s{[]any{", ctor, syntaxOf(stripFlags(x)), ctor, goParam(x.Name), t, name, name)
				if x.Token != "" {
					fmt.Fprintf(&g.types, "%q, ", x.Token)
				}
				fmt.Fprintf(&g.types, "%s}}\n}\n\n", goParam(x.Name))
			}
		}
		return name, kOneof
	}
	panic(fmt.Sprintf("argument %s: unknown type %q", a.Name, a.Type))
}

// collapsible: a choice of tokens and one plain string (XADD's <* | id>), held as a string.
func collapsible(a arg) bool {
	others := 0
	for _, x := range a.Arguments {
		switch {
		case x.Type == "pure-token":
		case (x.Type == "string" || x.Type == "key") && x.Token == "" && len(x.Flags) == 0:
			others++
		default:
			return false
		}
	}
	return others == 1
}

// flat: a block whose arguments are all required and single (a constructor's parameters).
func flat(a arg) bool {
	for _, x := range a.Arguments {
		if x.optional() || x.multiple() || x.Name == "numkeys" {
			return false
		}
	}
	return true
}

func stripFlags(a arg) arg {
	a.Flags = nil
	return a
}

var goKeywords = map[string]bool{
	"break": true, "case": true, "chan": true, "const": true, "continue": true, "default": true,
	"defer": true, "else": true, "fallthrough": true, "for": true, "func": true, "go": true,
	"goto": true, "if": true, "import": true, "interface": true, "map": true, "package": true,
	"range": true, "return": true, "select": true, "struct": true, "switch": true, "type": true,
	"var": true, "a": true, "r": true, "opts": true, "len": true, "any": true, "string": true,
}

func goParam(name string) string {
	p := lowerFirst(camel(name))
	if goKeywords[p] {
		p += "_"
	}
	return p
}

// field is one argument as a Go field or parameter: its declaration type and how to append it.
type field struct {
	a      arg
	name   string // the Go field or parameter name
	typ    string // declared type
	elem   string // the element type (multiple)
	kind   goKind
	count  bool // a numkeys counted from the next argument
	countN string
}

func (g *goGen) field(a arg, name, typePrefix string) field {
	f := field{a: a, name: name}
	t, k := g.typeOf(stripFlags(a), typePrefix+camel(a.Name))
	f.elem, f.kind = t, k
	switch {
	case a.multiple():
		f.typ = "[]" + t
	case a.optional() && k == kSimple && (t == "int64" || t == "float64"):
		f.typ = "*" + t
	case a.optional() && k == kBlock:
		f.typ = "*" + t
	default:
		f.typ = t
	}
	return f
}

// appendValue writes the code that appends the value v of f's argument (one element, not
// optional) to a.
func appendValue(b *bytes.Buffer, f field, v, indent string) {
	a := f.a
	if a.Token != "" && f.kind != kBool {
		fmt.Fprintf(b, "%sa = append(a, %q)\n", indent, a.Token)
	}
	switch f.kind {
	case kBool:
		fmt.Fprintf(b, "%sa = append(a, %q)\n", indent, a.Token)
	case kBlock:
		fmt.Fprintf(b, "%sa = %s.appendArgs(a)\n", indent, v)
	case kEnum:
		fmt.Fprintf(b, "%sa = append(a, string(%s))\n", indent, v)
	case kOneof:
		fmt.Fprintf(b, "%sa = append(a, %s.args...)\n", indent, v)
	default:
		fmt.Fprintf(b, "%sa = append(a, %s)\n", indent, v)
	}
}

// appendField writes the code that appends f (held in v) to a, as its flags say.
func appendField(b *bytes.Buffer, f field, v string) {
	a := f.a
	if f.count {
		fmt.Fprintf(b, "\ta = append(a, int64(len(%s)))\n", f.countN)
		return
	}
	if a.multiple() {
		if a.has("multiple_token") || a.Token == "" || f.kind == kBool {
			fmt.Fprintf(b, "\tfor _, x := range %s {\n", v)
			appendValue(b, f, "x", "\t\t")
			b.WriteString("\t}\n")
			return
		}
		// The token once, then every element.
		fmt.Fprintf(b, "\tif len(%s) > 0 {\n\t\ta = append(a, %q)\n\t}\n\tfor _, x := range %s {\n", v, a.Token, v)
		g := f
		g.a.Token = ""
		appendValue(b, g, "x", "\t\t")
		b.WriteString("\t}\n")
		return
	}
	if !a.optional() {
		appendValue(b, f, v, "\t")
		return
	}
	switch {
	case f.kind == kBool:
		fmt.Fprintf(b, "\tif %s {\n", v)
		appendValue(b, f, v, "\t\t")
	case strings.HasPrefix(f.typ, "*") && f.kind == kSimple:
		fmt.Fprintf(b, "\tif %s != nil {\n", v)
		appendValue(b, f, "*"+v, "\t\t")
	case f.typ == "any" || strings.HasPrefix(f.typ, "*"):
		fmt.Fprintf(b, "\tif %s != nil {\n", v)
		appendValue(b, f, v, "\t\t")
	case f.kind == kOneof:
		fmt.Fprintf(b, "\tif %s.args != nil {\n", v)
		appendValue(b, f, v, "\t\t")
	default: // string, enum: empty is absent
		fmt.Fprintf(b, "\tif %s != \"\" {\n", v)
		appendValue(b, f, v, "\t\t")
	}
	b.WriteString("\t}\n")
}

// fields makes the fields of an argument list, marking a numkeys that counts the argument
// after it.
func (g *goGen) fields(args []arg, typePrefix string, nameOf func(arg) string) []field {
	fs := make([]field, len(args))
	for i, a := range args {
		fs[i] = g.field(a, nameOf(a), typePrefix)
	}
	for i := range fs {
		if fs[i].a.Name == "numkeys" && !fs[i].a.optional() && i+1 < len(fs) && fs[i+1].a.multiple() {
			fs[i].count = true
			fs[i].countN = "$NEXT"
		}
	}
	return fs
}

func optionalDoc(f field) string {
	switch {
	case f.a.multiple():
		return "none when empty"
	case f.kind == kBool:
		return "sent when true"
	case f.kind == kOneof:
		return "none when zero"
	case strings.HasPrefix(f.typ, "*") || f.typ == "any":
		return "none when nil"
	default:
		return "none when empty"
	}
}

func (g *goGen) block(a arg, name string) {
	var body bytes.Buffer
	fs := g.fields(a.Arguments, name, func(x arg) string { return camel(x.Name) })
	fmt.Fprintf(&body, "// %s is %s.\ntype %s struct {\n", name, syntax(a.Arguments), name)
	for _, f := range fs {
		if f.count {
			continue
		}
		doc := syntaxOf(f.a)
		if f.a.optional() {
			doc += " (" + optionalDoc(f) + ")"
		}
		fmt.Fprintf(&body, "\t%s %s // %s\n", f.name, f.typ, doc)
	}
	body.WriteString("}\n\n")
	fmt.Fprintf(&body, "func (v %s) appendArgs(a []any) []any {\n", name)
	for i, f := range fs {
		if f.count {
			f.countN = "v." + fs[i+1].name
		}
		appendField(&body, f, "v."+f.name)
	}
	body.WriteString("\treturn a\n}\n\n")
	g.types.Write(body.Bytes())
}

func genGo(version, specName string, cmds []command) ([]byte, error) {
	g := &goGen{}
	var methods bytes.Buffer
	for _, c := range cmds {
		upper := strings.ToUpper(c.Name)
		var required, optional []field
		fs := g.fields(c.Doc.Arguments, upper, func(x arg) string { return goParam(x.Name) })
		names := map[string]int{}
		for i := range fs {
			f := &fs[i]
			if f.a.optional() {
				f.name = camel(f.a.Name)
				for _, o := range optional {
					if o.name == f.name && f.a.Token != "" {
						f.name = camel(strings.ToLower(f.a.Token))
					}
				}
				optional = append(optional, *f)
				continue
			}
			if n := names[f.name]; n > 0 {
				f.name = fmt.Sprintf("%s%d", f.name, n+1)
			}
			names[f.name]++
			if !f.count {
				required = append(required, *f)
			}
		}
		for i := range fs {
			if fs[i].count {
				fs[i].countN = fs[i+1].name
				if fs[i+1].a.optional() {
					fs[i].countN = "opts." + fs[i+1].name
				}
			}
		}
		// Parameters: the required arguments in order; a multiple one last becomes variadic.
		var params []string
		var call []string
		for i, f := range required {
			t := f.typ
			if f.a.multiple() && i == len(required)-1 {
				t = "..." + f.elem
			}
			params = append(params, f.name+" "+t)
			call = append(call, f.name)
		}
		variadic := len(required) > 0 && required[len(required)-1].a.multiple()
		doc := fmt.Sprintf("// %s queues %s %s\n//\n// %s (Redis %s, group %s.)\n",
			upper, upper, syntax(c.Doc.Arguments), sentence(c.Doc.Summary), c.Doc.Since, c.Doc.Group)
		if len(optional) == 0 {
			fmt.Fprintf(&methods, "%sfunc (r *Commands) %s(%s) error {\n\ta := make([]any, 0, %d)\n", doc, upper, strings.Join(params, ", "), len(fs)+2)
			for _, f := range fs {
				appendField(&methods, f, f.name)
			}
			fmt.Fprintf(&methods, "\treturn r.queue(%q, a)\n}\n\n", upper)
			continue
		}
		// An options struct for the optional arguments, and two methods: without and with it.
		opts := upper + "Options"
		fmt.Fprintf(&g.types, "// %s are the optional arguments of %s (%s).\ntype %s struct {\n", opts, upper, c.Doc.Group, opts)
		for _, f := range optional {
			fmt.Fprintf(&g.types, "\t%s %s // %s (%s)\n", f.name, f.typ, syntaxOf(f.a), optionalDoc(f))
		}
		g.types.WriteString("}\n\n")
		withParams := append([]string{}, params...)
		withCall := append([]string{}, call...)
		insert := len(withParams)
		if variadic {
			insert--
			withCall[len(withCall)-1] += "..."
		}
		withParams = append(withParams[:insert], append([]string{"opts " + opts}, withParams[insert:]...)...)
		withCall = append(withCall[:insert], append([]string{opts + "{}"}, withCall[insert:]...)...)
		fmt.Fprintf(&methods, "%s//\n// %sWith takes the optional arguments too.\nfunc (r *Commands) %s(%s) error {\n\treturn r.%sWith(%s)\n}\n\n",
			doc, upper, upper, strings.Join(params, ", "), upper, strings.Join(withCall, ", "))
		fmt.Fprintf(&methods, "// %sWith queues %s with its optional arguments (%s).\nfunc (r *Commands) %sWith(%s) error {\n\ta := make([]any, 0, %d)\n",
			upper, upper, opts, upper, strings.Join(withParams, ", "), len(fs)+4)
		for _, f := range fs {
			v := f.name
			if f.a.optional() {
				v = "opts." + f.name
			}
			appendField(&methods, f, v)
		}
		fmt.Fprintf(&methods, "\treturn r.queue(%q, a)\n}\n\n", upper)
	}
	var out bytes.Buffer
	fmt.Fprintf(&out, "// Code generated by internal/gencommands from rediscommands/%s (Redis %s's COMMAND DOCS and COMMAND INFO); DO NOT EDIT.\n\npackage window\n\n", specName, version)
	fmt.Fprintf(&out, "// RedisSpecVersion is the Redis version whose command specification the typed methods of\n// Commands were generated from.\nconst RedisSpecVersion = %q\n\n", version)
	fmt.Fprintf(&out, "// CommandNames are the commands Commands has a typed method for, in Redis's spelling.\nvar CommandNames = []string{\n")
	for _, c := range cmds {
		fmt.Fprintf(&out, "\t%q,\n", strings.ToUpper(c.Name))
	}
	out.WriteString("}\n\n")
	out.Write(methods.Bytes())
	out.Write(g.types.Bytes())
	src, err := format.Source(out.Bytes())
	if err != nil {
		return out.Bytes(), fmt.Errorf("gofmt of the generated code: %w", err)
	}
	return src, nil
}

func sentence(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return s
	}
	if !strings.HasSuffix(s, ".") {
		s += "."
	}
	return s
}
