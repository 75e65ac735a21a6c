package main

import (
	"bytes"
	"fmt"
	"strings"
)

// The Java client's RedisCommands: one method per command (the name in lower case, as redis-py
// and the Redis documentation spell it), returning the RedisCommands for chaining; optional
// arguments in a <Name>Options with fluent setters, taken by an overload; a choice of tokens is
// an enum, any other choice a class with static factories; a block a class whose constructor
// takes its required arguments.

type javaGen struct {
	types bytes.Buffer
}

type jField struct {
	a      arg
	name   string // Java field / parameter name
	typ    string // the declared type (boxed when optional)
	elem   string
	kind   goKind
	count  bool
	countN string
}

var javaKeywords = map[string]bool{
	"abstract": true, "assert": true, "boolean": true, "break": true, "byte": true, "case": true,
	"catch": true, "char": true, "class": true, "const": true, "continue": true, "default": true,
	"do": true, "double": true, "else": true, "enum": true, "extends": true, "final": true,
	"finally": true, "float": true, "for": true, "goto": true, "if": true, "implements": true,
	"import": true, "instanceof": true, "int": true, "interface": true, "long": true,
	"native": true, "new": true, "package": true, "private": true, "protected": true,
	"public": true, "return": true, "short": true, "static": true, "strictfp": true,
	"super": true, "switch": true, "synchronized": true, "this": true, "throw": true,
	"throws": true, "transient": true, "try": true, "void": true, "volatile": true,
	"while": true, "a": true, "opts": true, "x": true,
}

func jParam(name string) string {
	p := lowerFirst(camel(name))
	if javaKeywords[p] {
		p += "Arg"
	}
	return p
}

func jConst(a arg) string {
	t := tokenIdent(a)
	return strings.ToUpper(camelSplit(t))
}

// camelSplit: "UnixTimeSeconds" -> "Unix_Time_Seconds" (for constants); tokens stay.
func camelSplit(s string) string {
	var b strings.Builder
	for i, r := range s {
		if i > 0 && r >= 'A' && r <= 'Z' && s[i-1] >= 'a' && s[i-1] <= 'z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func jFactory(a arg) string {
	t := tokenIdent(a)
	if a.Token != "" && t == strings.ToUpper(a.Token) {
		t = strings.ToLower(t)
	} else {
		t = lowerFirst(t)
	}
	if javaKeywords[t] {
		t += "Of"
	}
	return t
}

func boxed(t string) string {
	switch t {
	case "long":
		return "Long"
	case "double":
		return "Double"
	case "boolean":
		return "Boolean"
	}
	return t
}

func (g *javaGen) typeOf(a arg, name string) (string, goKind) {
	switch a.Type {
	case "key", "pattern":
		return "String", kSimple
	case "string":
		return "Object", kSimple
	case "integer", "unix-time":
		return "long", kSimple
	case "double":
		return "double", kSimple
	case "pure-token":
		return "boolean", kBool
	case "block":
		g.block(a, name)
		return name, kBlock
	case "oneof":
		if collapsible(a) {
			return "String", kSimple
		}
		allTokens := true
		for _, x := range a.Arguments {
			if x.Type != "pure-token" {
				allTokens = false
			}
		}
		if allTokens {
			fmt.Fprintf(&g.types, "  /** One of {@code %s}. */\n  public enum %s {\n", jdoc(syntaxOf(arg{Type: "oneof", Arguments: a.Arguments})), name)
			for i, x := range a.Arguments {
				sep := ","
				if i == len(a.Arguments)-1 {
					sep = ";"
				}
				fmt.Fprintf(&g.types, "    /** {@code %s} */\n    %s(%q)%s\n", jdoc(x.Token), jConst(x), x.Token, sep)
			}
			fmt.Fprintf(&g.types, "\n    private final String token;\n\n    %s(String token) {\n      this.token = token;\n    }\n\n    /** The token as Redis spells it. */\n    public String token() {\n      return token;\n    }\n  }\n\n", name)
			return name, kEnum
		}
		fmt.Fprintf(&g.types, "  /** One of {@code %s}: made by its static factories. */\n  public static final class %s {\n    final List<Object> args;\n\n    private %s(List<Object> args) {\n      this.args = args;\n    }\n", jdoc(syntaxOf(arg{Type: "oneof", Arguments: a.Arguments})), name, name)
		var ctors bytes.Buffer
		for _, x := range a.Arguments {
			f := jFactory(x)
			switch x.Type {
			case "pure-token":
				fmt.Fprintf(&ctors, "\n    /** {@code %s} */\n    public static %s %s() {\n      return new %s(List.of(%q));\n    }\n", jdoc(x.Token), name, f, name, x.Token)
			case "block":
				fs := g.fields(x.Arguments, name+camel(x.Name))
				var ps []string
				var body bytes.Buffer
				if x.Token != "" {
					fmt.Fprintf(&body, "      a.add(%q);\n", x.Token)
				}
				for _, jf := range fs {
					ps = append(ps, jf.typ+" "+jf.name)
					jAppendField(&body, jf, jf.name, "      ")
				}
				if !flat(x) {
					bt, _ := g.typeOf(stripFlags(x), name+camel(x.Name)+"Args")
					ps = []string{bt + " v"}
					body.Reset()
					if x.Token != "" {
						fmt.Fprintf(&body, "      a.add(%q);\n", x.Token)
					}
					body.WriteString("      v.appendTo(a);\n")
				}
				fmt.Fprintf(&ctors, "\n    /** {@code %s} */\n    public static %s %s(%s) {\n      List<Object> a = new ArrayList<>();\n%s      return new %s(a);\n    }\n", jdoc(syntaxOf(stripFlags(x))), name, f, strings.Join(ps, ", "), body.String(), name)
			default:
				t, _ := g.typeOf(stripFlags(x), "")
				p := jParam(x.Name)
				tok := ""
				if x.Token != "" {
					tok = fmt.Sprintf("%q, ", x.Token)
				}
				fmt.Fprintf(&ctors, "\n    /** {@code %s} */\n    public static %s %s(%s %s) {\n      return new %s(List.of(%s%s));\n    }\n", jdoc(syntaxOf(stripFlags(x))), name, f, t, p, name, tok, p)
			}
		}
		g.types.Write(ctors.Bytes())
		g.types.WriteString("  }\n\n")
		return name, kOneof
	}
	panic(fmt.Sprintf("argument %s: unknown type %q", a.Name, a.Type))
}

func jdoc(s string) string {
	s = strings.ReplaceAll(s, "*/", "*&#47;")
	s = strings.ReplaceAll(s, "@", "&#64;")
	s = strings.ReplaceAll(s, "{", "&#123;")
	s = strings.ReplaceAll(s, "}", "&#125;")
	return s
}

func (g *javaGen) field(a arg, typePrefix string) jField {
	f := jField{a: a, name: jParam(a.Name)}
	t, k := g.typeOf(stripFlags(a), typePrefix+camel(a.Name))
	f.elem, f.kind = t, k
	switch {
	case a.multiple():
		f.typ = "List<" + boxed(t) + ">"
	case a.optional() && k != kBool:
		f.typ = boxed(t)
	default:
		f.typ = t
	}
	return f
}

func (g *javaGen) fields(args []arg, typePrefix string) []jField {
	fs := make([]jField, len(args))
	for i, a := range args {
		fs[i] = g.field(a, typePrefix)
	}
	for i := range fs {
		if fs[i].a.Name == "numkeys" && !fs[i].a.optional() && i+1 < len(fs) && fs[i+1].a.multiple() {
			fs[i].count = true
		}
	}
	for i := range fs {
		if fs[i].count {
			fs[i].countN = fs[i+1].name
		}
	}
	return fs
}

func jAppendValue(b *bytes.Buffer, f jField, v, indent string) {
	a := f.a
	if a.Token != "" && f.kind != kBool {
		fmt.Fprintf(b, "%sa.add(%q);\n", indent, a.Token)
	}
	switch f.kind {
	case kBool:
		fmt.Fprintf(b, "%sa.add(%q);\n", indent, a.Token)
	case kBlock:
		fmt.Fprintf(b, "%s%s.appendTo(a);\n", indent, v)
	case kEnum:
		fmt.Fprintf(b, "%sa.add(%s.token());\n", indent, v)
	case kOneof:
		fmt.Fprintf(b, "%sa.addAll(%s.args);\n", indent, v)
	default:
		fmt.Fprintf(b, "%sa.add(%s);\n", indent, v)
	}
}

func jAppendField(b *bytes.Buffer, f jField, v, indent string) {
	a := f.a
	if f.count {
		fmt.Fprintf(b, "%sa.add((long) %s.size());\n", indent, f.countN)
		return
	}
	if a.multiple() {
		if a.has("multiple_token") || a.Token == "" || f.kind == kBool {
			fmt.Fprintf(b, "%sfor (%s x : %s) {\n", indent, boxed(f.elem), v)
			jAppendValue(b, f, "x", indent+"  ")
			fmt.Fprintf(b, "%s}\n", indent)
			return
		}
		fmt.Fprintf(b, "%sif (!%s.isEmpty()) {\n%s  a.add(%q);\n%s}\n%sfor (%s x : %s) {\n", indent, v, indent, a.Token, indent, indent, boxed(f.elem), v)
		g := f
		g.a.Token = ""
		jAppendValue(b, g, "x", indent+"  ")
		fmt.Fprintf(b, "%s}\n", indent)
		return
	}
	if !a.optional() {
		jAppendValue(b, f, v, indent)
		return
	}
	if f.kind == kBool {
		fmt.Fprintf(b, "%sif (%s) {\n", indent, v)
	} else {
		fmt.Fprintf(b, "%sif (%s != null) {\n", indent, v)
	}
	jAppendValue(b, f, v, indent+"  ")
	fmt.Fprintf(b, "%s}\n", indent)
}

// optionsClass writes a class of fields with fluent setters (the optional ones) and a
// constructor of the required ones; appendTo encodes them all in order.
func (g *javaGen) optionsClass(name, doc string, fs []jField, withAppend bool) {
	var required []jField
	for _, f := range fs {
		if !f.a.optional() && !f.count {
			required = append(required, f)
		}
	}
	fmt.Fprintf(&g.types, "  /** %s */\n  public static final class %s {\n", doc, name)
	for _, f := range fs {
		if f.count {
			continue
		}
		init := ""
		if f.a.multiple() && f.a.optional() {
			init = " = new ArrayList<>()"
		}
		mod := "private "
		if !f.a.optional() {
			mod = "private final "
		}
		fmt.Fprintf(&g.types, "    %s%s %s%s;\n", mod, f.typ, f.name, init)
	}
	var ps, as []string
	for _, f := range required {
		t := f.typ
		ps = append(ps, t+" "+f.name)
		if f.kind == kSimple && (f.typ == "long" || f.typ == "double") || f.kind == kBool {
			as = append(as, fmt.Sprintf("      this.%s = %s;\n", f.name, f.name))
		} else {
			as = append(as, fmt.Sprintf("      this.%s = Objects.requireNonNull(%s, %q);\n", f.name, f.name, f.name))
		}
	}
	if len(required) > 0 {
		fmt.Fprintf(&g.types, "\n    /** The required arguments. */\n    public %s(%s) {\n%s    }\n", name, strings.Join(ps, ", "), strings.Join(as, ""))
	} else {
		fmt.Fprintf(&g.types, "\n    /** None set. */\n    public %s() {}\n", name)
	}
	for _, f := range fs {
		if !f.a.optional() {
			continue
		}
		d := jdoc(syntaxOf(f.a))
		switch {
		case f.kind == kBool:
			fmt.Fprintf(&g.types, "\n    /** {@code %s} */\n    public %s %s() {\n      this.%s = true;\n      return this;\n    }\n", d, name, f.name, f.name)
		case f.a.multiple():
			fmt.Fprintf(&g.types, "\n    /** {@code %s} */\n    public %s %s(List<%s> %s) {\n      this.%s = List.copyOf(%s);\n      return this;\n    }\n", d, name, f.name, boxed(f.elem), f.name, f.name, f.name)
		default:
			fmt.Fprintf(&g.types, "\n    /** {@code %s} */\n    public %s %s(%s %s) {\n      this.%s = %s;\n      return this;\n    }\n", d, name, f.name, f.elem, f.name, f.name, f.name)
		}
	}
	if withAppend {
		g.types.WriteString("\n    void appendTo(List<Object> a) {\n")
		for _, f := range fs {
			jAppendField(&g.types, f, f.name, "      ")
		}
		g.types.WriteString("    }\n")
	}
	g.types.WriteString("  }\n\n")
}

func (g *javaGen) block(a arg, name string) {
	fs := g.fields(a.Arguments, name)
	g.optionsClass(name, "{@code "+jdoc(syntax(a.Arguments))+"}", fs, true)
}

func javaClassPrefix(cmd string) string {
	return strings.ToUpper(cmd[:1]) + cmd[1:]
}

func genJava(version, specName string, cmds []command) ([]byte, error) {
	g := &javaGen{}
	var methods bytes.Buffer
	for _, c := range cmds {
		prefix := javaClassPrefix(c.Name)
		fs := g.fields(c.Doc.Arguments, prefix)
		var required, optional []jField
		seen := map[string]bool{}
		for i := range fs {
			f := &fs[i]
			if f.a.optional() {
				for _, o := range optional {
					if o.name == f.name && f.a.Token != "" {
						f.name = jParam(strings.ToLower(f.a.Token))
					}
				}
				optional = append(optional, *f)
				continue
			}
			for n := 2; seen[f.name]; n++ {
				f.name = fmt.Sprintf("%s%d", jParam(f.a.Name), n)
			}
			seen[f.name] = true
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
		var params, call []string
		for i, f := range required {
			t := f.typ
			if f.a.multiple() && i == len(required)-1 {
				t = f.elem + "..."
			}
			params = append(params, t+" "+f.name)
			call = append(call, f.name)
		}
		variadic := len(required) > 0 && required[len(required)-1].a.multiple()
		doc := fmt.Sprintf("  /**\n   * Queues {@code %s %s}.\n   *\n   * <p>%s (Redis %s, group %s.)\n   */\n",
			strings.ToUpper(c.Name), jdoc(syntax(c.Doc.Arguments)), jdoc(sentence(c.Doc.Summary)), c.Doc.Since, c.Doc.Group)
		body := func(optsExpr string) string {
			var b bytes.Buffer
			b.WriteString("    List<Object> a = new ArrayList<>();\n")
			for _, f := range fs {
				v := f.name
				if f.a.optional() {
					v = optsExpr + "." + f.name
				} else if f.a.multiple() && variadic && f.name == required[len(required)-1].name {
					v = "List.of(" + f.name + ")"
				}
				if f.count && strings.HasPrefix(f.countN, "opts.") {
					f.countN = optsExpr + strings.TrimPrefix(f.countN, "opts")
				} else if f.count && variadic && f.countN == required[len(required)-1].name {
					f.countN = "List.of(" + f.countN + ")"
				}
				jAppendField(&b, f, v, "    ")
			}
			fmt.Fprintf(&b, "    return queue(%q, a);\n", strings.ToUpper(c.Name))
			return b.String()
		}
		if len(optional) == 0 {
			fmt.Fprintf(&methods, "%s  public RedisCommands %s(%s) {\n%s  }\n\n", doc, jMethod(c.Name), strings.Join(params, ", "), body(""))
			continue
		}
		opts := prefix + "Options"
		var optFields []jField
		for _, f := range optional {
			optFields = append(optFields, f)
		}
		g.optionsClass(opts, "The optional arguments of {@code "+strings.ToUpper(c.Name)+"}: none set by default.", optFields, false)
		withParams := append([]string{}, params...)
		withCall := append([]string{}, call...)
		insert := len(withParams)
		if variadic {
			insert--
		}
		withParams = append(withParams[:insert], append([]string{opts + " opts"}, withParams[insert:]...)...)
		withCall = append(withCall[:insert], append([]string{"new " + opts + "()"}, withCall[insert:]...)...)
		fmt.Fprintf(&methods, "%s  public RedisCommands %s(%s) {\n    return %s(%s);\n  }\n\n", doc, jMethod(c.Name), strings.Join(params, ", "), jMethod(c.Name), strings.Join(withCall, ", "))
		fmt.Fprintf(&methods, "  /** Queues {@code %s} with its optional arguments ({@link %s}). */\n  public RedisCommands %s(%s) {\n    Objects.requireNonNull(opts, \"opts\");\n%s  }\n\n",
			strings.ToUpper(c.Name), opts, jMethod(c.Name), strings.Join(withParams, ", "), body("opts"))
	}
	var out bytes.Buffer
	fmt.Fprintf(&out, "// Code generated by client-examples/go/internal/gencommands from rediscommands/%s\n// (Redis %s's COMMAND DOCS and COMMAND INFO); DO NOT EDIT. Regenerate with generate-commands.sh.\npackage dev.windowsidecar.client;\n\n", specName, version)
	out.WriteString("import java.util.ArrayList;\nimport java.util.List;\nimport java.util.Objects;\n\n")
	fmt.Fprintf(&out, `/**
 * Typed Redis commands queued as a delivery's side effects ({@link Delivery#redis()}): {@code
 * d.redis().hincrby(key, field, 1)} is {@code d.queue("HINCRBY", key, field, 1)} with the command's
 * name, its arguments and their types checked by the compiler. Generated from Redis's own command
 * specification, the COMMAND DOCS and COMMAND INFO replies of Redis {@value #REDIS_SPEC_VERSION}:
 * every command of the data groups that writes (strings, hashes, lists, sets, sorted sets,
 * streams, keys, HyperLogLog, geo, bitmaps) and PUBLISH / SPUBLISH, not the blocking ones and not
 * those the sidecar refuses. Anything else: {@link Delivery#queue}.
 *
 * <p>A key or pattern is a {@code String}; a string argument takes what {@link Delivery#queue}
 * takes; an integer is a {@code long}, a double a {@code double}. A command's optional arguments
 * go in its {@code <Name>Options} (fluent setters), taken by an overload; a choice of tokens is an
 * enum, any other choice a class made by its static factories ({@code SetExpiration.ex(60)}).
 * Each method returns this, for chaining, and throws like {@link Delivery#queue}.
 */
public final class RedisCommands {
  /** The Redis version whose command specification these methods were generated from. */
  public static final String REDIS_SPEC_VERSION = %q;

  /** The commands this class has a method for, in Redis's spelling. */
  public static final List<String> COMMAND_NAMES =
      List.of(
`, version)
	for i, c := range cmds {
		sep := ","
		if i == len(cmds)-1 {
			sep = ");"
		}
		fmt.Fprintf(&out, "          %q%s\n", strings.ToUpper(c.Name), sep)
	}
	out.WriteString(`
  private final Delivery delivery;

  RedisCommands(Delivery delivery) {
    this.delivery = delivery;
  }

  private RedisCommands queue(String name, List<Object> args) {
    delivery.queue(name, args.toArray());
    return this;
  }

`)
	out.Write(methods.Bytes())
	out.Write(g.types.Bytes())
	out.WriteString("}\n")
	return out.Bytes(), nil
}

func jMethod(name string) string {
	if javaKeywords[name] {
		return name + "Command"
	}
	return name
}
