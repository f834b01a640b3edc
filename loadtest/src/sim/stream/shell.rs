//! The built-in programs of a simulated container and the tiny `sh` that runs them: what
//! `kubectl exec POD -- CMD...` and `kubectl attach` execute.
//!
//! Programs: `sh`/`bash` (`-c SCRIPT`, a script file, or line by line from stdin; with a terminal
//! an interactive prompt `# `), `echo`, `cat`, `true`, `false`, `env`, `printenv`, `hostname`,
//! `ls`, `date`, `pwd`, `test`/`[`, `sleep`, `mkdir`, `rm`, `touch`, `head`, `wc`, `seq`, `uname`,
//! `id`, `whoami`, `stty size` and `tar` (see `stream::tar`). The shell language is a subset:
//! `;`, `&&`, `||`, newlines, pipelines, `>`/`>>`/`<`/`2>`/`2>&1` redirections, quotes, `$VAR`,
//! `$?`, and the `cd`, `export`, `exit` built-ins.
//!
//! Called by `stream::exec` with protocol-independent streams (`stream::process`). It never
//! touches the host: files live in the pod's in-memory filesystem (`stream::fs`).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::fs::{self, FsError, Node};
use super::process::{PodContext, ProcessIo, Sink, Stdin, CHANNEL_CHUNKS};
use super::status::ProcessExit;

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Programs an exec can start (by base name, so `/bin/sh` works too).
const PROGRAMS: &[&str] = &[
    "sh", "bash", "ash", "echo", "cat", "true", "false", "env", "printenv", "hostname", "ls",
    "date", "pwd", "test", "[", "sleep", "mkdir", "rm", "touch", "head", "wc", "seq", "uname",
    "id", "whoami", "stty", "tar", "tail",
];

/// Runs `argv` as the process of an exec session and reports how it ended.
pub(crate) async fn run_exec(argv: Vec<String>, io: ProcessIo, ctx: PodContext) -> ProcessExit {
    let Some(program) = argv.first() else {
        return ProcessExit::StartFailed(
            "OCI runtime exec failed: exec failed: unable to start container process: exec: \"\": executable file not found in $PATH: unknown".to_string(),
        );
    };
    if !PROGRAMS.contains(&base_name(program)) {
        return ProcessExit::StartFailed(format!(
            "OCI runtime exec failed: exec failed: unable to start container process: exec: \"{program}\": executable file not found in $PATH: unknown"
        ));
    }
    let ProcessIo {
        mut stdin,
        stdout,
        stderr,
    } = io;
    let mut state = ShellState::new(ctx);
    let code = match run_program(argv, &mut stdin, &stdout, &stderr, &mut state).await {
        Flow::Normal(code) | Flow::Exit(code) => code,
    };
    ProcessExit::Code(code)
}

/// The main process of the container, as `kubectl attach` sees it: echoes stdin to stdout until
/// stdin ends. Without stdin it produces nothing and runs until the client goes away.
pub(crate) async fn run_attach(io: ProcessIo, has_stdin: bool) -> ProcessExit {
    let ProcessIo {
        mut stdin, stdout, ..
    } = io;
    if !has_stdin {
        std::future::pending::<()>().await;
    }
    while let Some(chunk) = stdin.read().await {
        if stdout.write(&chunk).await.is_err() {
            break;
        }
    }
    ProcessExit::Code(0)
}

fn base_name(program: &str) -> &str {
    program.rsplit('/').next().unwrap_or(program)
}

/// Variables, working directory and last status of one shell (or of one program run directly).
#[derive(Clone)]
pub(crate) struct ShellState {
    pub(crate) ctx: PodContext,
    env: BTreeMap<String, String>,
    cwd: String,
    last_status: i32,
}

impl ShellState {
    pub(crate) fn new(ctx: PodContext) -> Self {
        let mut env = BTreeMap::new();
        env.insert(
            "PATH".to_string(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        );
        env.insert("HOSTNAME".to_string(), ctx.pod.clone());
        env.insert("HOME".to_string(), "/root".to_string());
        env.insert(
            "KUBERNETES_SERVICE_HOST".to_string(),
            "10.96.0.1".to_string(),
        );
        env.insert("KUBERNETES_SERVICE_PORT".to_string(), "443".to_string());
        if ctx.tty {
            env.insert("TERM".to_string(), "xterm".to_string());
        }
        ShellState {
            ctx,
            env,
            cwd: "/".to_string(),
            last_status: 0,
        }
    }

    /// `arg` as an absolute path, relative to the working directory.
    pub(crate) fn resolve(&self, arg: &str) -> String {
        fs::normalize(&self.cwd, arg)
    }
}

/// Whether a script ran to its end or hit `exit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Normal(i32),
    Exit(i32),
}

impl Flow {
    fn code(self) -> i32 {
        match self {
            Flow::Normal(c) | Flow::Exit(c) => c,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing: a script is a list of pipelines joined by `;`, `&&`, `||`; a pipeline is stages
// joined by `|`. Stages are kept as raw text and expanded only when they run, so `$?` sees the
// status of the command before.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Connector {
    Always,
    IfSuccess,
    IfFailure,
}

#[derive(Debug)]
struct ListItem {
    /// How this item depends on the status of the item before.
    connector: Connector,
    stages: Vec<String>,
}

fn split_script(script: &str) -> Vec<ListItem> {
    let mut items = Vec::new();
    let mut stages = Vec::new();
    let mut current = String::new();
    let mut connector = Connector::Always;
    let chars: Vec<char> = script.chars().collect();
    let mut i = 0;
    let (mut single, mut double) = (false, false);
    let mut flush_item = |stages: &mut Vec<String>, current: &mut String, connector: Connector| {
        let stage = std::mem::take(current);
        if !stage.trim().is_empty() {
            stages.push(stage);
        }
        if !stages.is_empty() {
            items.push(ListItem {
                connector,
                stages: std::mem::take(stages),
            });
        }
    };
    while i < chars.len() {
        let c = chars[i];
        if single {
            current.push(c);
            single = c != '\'';
        } else if double {
            current.push(c);
            if c == '\\' && i + 1 < chars.len() {
                current.push(chars[i + 1]);
                i += 1;
            } else if c == '"' {
                double = false;
            }
        } else {
            match c {
                '\'' => {
                    single = true;
                    current.push(c);
                }
                '"' => {
                    double = true;
                    current.push(c);
                }
                '\\' if i + 1 < chars.len() => {
                    current.push(c);
                    current.push(chars[i + 1]);
                    i += 1;
                }
                '$' if chars.get(i + 1) == Some(&'(') => {
                    // A command substitution is one piece of the stage, whatever it contains.
                    let end = matching_paren(&chars, i + 1).unwrap_or(chars.len() - 1);
                    current.extend(&chars[i..=end]);
                    i = end;
                }
                '`' => {
                    let end = chars[i + 1..]
                        .iter()
                        .position(|&c| c == '`')
                        .map_or(chars.len() - 1, |p| p + i + 1);
                    current.extend(&chars[i..=end]);
                    i = end;
                }
                '#' if current.is_empty() || current.ends_with(char::is_whitespace) => {
                    while i < chars.len() && chars[i] != '\n' {
                        i += 1;
                    }
                    continue;
                }
                ';' | '\n' => {
                    flush_item(&mut stages, &mut current, connector);
                    connector = Connector::Always;
                }
                '&' if chars.get(i + 1) == Some(&'&') => {
                    flush_item(&mut stages, &mut current, connector);
                    connector = Connector::IfSuccess;
                    i += 1;
                }
                '|' if chars.get(i + 1) == Some(&'|') => {
                    flush_item(&mut stages, &mut current, connector);
                    connector = Connector::IfFailure;
                    i += 1;
                }
                '|' => {
                    stages.push(std::mem::take(&mut current));
                }
                // `2>&1` and `>&2` keep their `&`.
                '&' if current.ends_with('>') => current.push(c),
                '&' => {
                    // No job control: a background command runs in the foreground.
                    flush_item(&mut stages, &mut current, connector);
                    connector = Connector::Always;
                }
                other => current.push(other),
            }
        }
        i += 1;
    }
    flush_item(&mut stages, &mut current, connector);
    items
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(String),
    /// An unquoted word with `*` or `?`: expanded against the pod filesystem.
    Glob(String),
    /// A redirection operator: `>`, `>>`, `<`, `2>`, `2>>`, `2>&1`, `>&2`.
    Redirect(String),
}

fn tokenize(raw: &str, st: &ShellState) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = raw.chars().collect();
    let mut tokens = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quoted = false;
    let mut i = 0;
    let finish =
        |tokens: &mut Vec<Token>, word: &mut String, in_word: &mut bool, quoted: &mut bool| {
            if *in_word {
                let text = std::mem::take(word);
                if !*quoted && text.contains(['*', '?']) {
                    tokens.push(Token::Glob(text));
                } else {
                    tokens.push(Token::Word(text));
                }
            }
            *in_word = false;
            *quoted = false;
        };
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => finish(&mut tokens, &mut word, &mut in_word, &mut quoted),
            '\'' => {
                in_word = true;
                quoted = true;
                i += 1;
                while i < chars.len() && chars[i] != '\'' {
                    word.push(chars[i]);
                    i += 1;
                }
                if i >= chars.len() {
                    return Err("unterminated quoted string".to_string());
                }
            }
            '"' => {
                in_word = true;
                quoted = true;
                i += 1;
                loop {
                    match chars.get(i) {
                        None => return Err("unterminated quoted string".to_string()),
                        Some('"') => break,
                        Some('\\') if matches!(chars.get(i + 1), Some('"' | '\\' | '$' | '`')) => {
                            word.push(chars[i + 1]);
                            i += 2;
                        }
                        Some('$') => {
                            i = expand_variable(&chars, i, st, &mut word);
                        }
                        Some(&other) => {
                            word.push(other);
                            i += 1;
                        }
                    }
                }
            }
            '\\' => {
                if let Some(&next) = chars.get(i + 1) {
                    if next != '\n' {
                        word.push(next);
                        in_word = true;
                        quoted = true;
                    }
                    i += 1;
                }
            }
            '$' => {
                in_word = true;
                i = expand_variable(&chars, i, st, &mut word);
                continue;
            }
            '>' | '<' => {
                let mut op = String::new();
                if in_word && !quoted && (word == "1" || word == "2") {
                    if word == "2" {
                        op.push('2');
                    }
                    word.clear();
                    in_word = false;
                } else {
                    finish(&mut tokens, &mut word, &mut in_word, &mut quoted);
                }
                op.push(c);
                if c == '>' && chars.get(i + 1) == Some(&'>') {
                    op.push('>');
                    i += 1;
                }
                if c == '>' && chars.get(i + 1) == Some(&'&') {
                    if let Some(&fd) = chars.get(i + 2).filter(|d| d.is_ascii_digit()) {
                        op.push('&');
                        op.push(fd);
                        i += 2;
                    }
                }
                tokens.push(Token::Redirect(op));
            }
            '~' if !in_word
                && chars
                    .get(i + 1)
                    .is_none_or(|n| *n == '/' || n.is_whitespace()) =>
            {
                in_word = true;
                word.push_str(st.env.get("HOME").map_or("/root", String::as_str));
            }
            other => {
                in_word = true;
                word.push(other);
            }
        }
        i += 1;
    }
    finish(&mut tokens, &mut word, &mut in_word, &mut quoted);
    Ok(tokens)
}

/// Expands the `$...` at `chars[start]` into `out`; returns the index after it.
fn expand_variable(chars: &[char], start: usize, st: &ShellState, out: &mut String) -> usize {
    let mut i = start + 1;
    match chars.get(i) {
        Some('?') => {
            out.push_str(&st.last_status.to_string());
            i + 1
        }
        Some('$') => {
            out.push('1');
            i + 1
        }
        Some('#') => {
            out.push('0');
            i + 1
        }
        Some('{') => {
            let end = chars[i..].iter().position(|&c| c == '}').map(|p| p + i);
            match end {
                Some(end) => {
                    let name: String = chars[i + 1..end].iter().collect();
                    out.push_str(st.env.get(&name).map_or("", String::as_str));
                    end + 1
                }
                None => {
                    out.push('$');
                    i
                }
            }
        }
        Some(c) if c.is_ascii_alphabetic() || *c == '_' => {
            let mut name = String::new();
            while let Some(&c) = chars
                .get(i)
                .filter(|c| c.is_ascii_alphanumeric() || **c == '_')
            {
                name.push(c);
                i += 1;
            }
            out.push_str(st.env.get(&name).map_or("", String::as_str));
            i
        }
        Some(c) if c.is_ascii_digit() => {
            // No positional parameters: `$0` is the shell, the rest are empty.
            if *c == '0' {
                out.push_str("sh");
            }
            i + 1
        }
        _ => {
            out.push('$');
            i
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Execution.

/// Runs a whole script in `st`.
fn run_script<'a>(
    script: &'a str,
    stdin: &'a mut Stdin,
    out: &'a Sink,
    err: &'a Sink,
    st: &'a mut ShellState,
) -> BoxFuture<'a, Flow> {
    Box::pin(async move {
        for item in split_script(script) {
            let skip = match item.connector {
                Connector::Always => false,
                Connector::IfSuccess => st.last_status != 0,
                Connector::IfFailure => st.last_status == 0,
            };
            if skip {
                continue;
            }
            let flow = if item.stages.len() == 1 {
                run_stage(&item.stages[0], stdin, out, err, st).await
            } else {
                run_pipeline(&item.stages, stdin, out, err, st).await
            };
            st.last_status = flow.code();
            if let Flow::Exit(_) = flow {
                return flow;
            }
        }
        Flow::Normal(st.last_status)
    })
}

/// Runs the stages of a pipeline concurrently, each in a copy of the shell state (as a real
/// shell runs them in subshells); the status is the last stage's.
async fn run_pipeline(
    stages: &[String],
    stdin: &mut Stdin,
    out: &Sink,
    err: &Sink,
    st: &mut ShellState,
) -> Flow {
    let mut input = std::mem::replace(stdin, Stdin::empty());
    let mut runs = Vec::with_capacity(stages.len());
    for (index, stage) in stages.iter().enumerate() {
        let (stage_out, next_input) = if index + 1 == stages.len() {
            (out.clone(), None)
        } else {
            let (tx, rx) = mpsc::channel::<Bytes>(CHANNEL_CHUNKS);
            (Sink::Channel { tx, crlf: false }, Some(Stdin::Channel(rx)))
        };
        let mut stage_stdin = input;
        input = next_input.unwrap_or_else(Stdin::empty);
        let stage = stage.clone();
        let err = err.clone();
        let mut stage_state = st.clone();
        runs.push(async move {
            let flow =
                run_stage(&stage, &mut stage_stdin, &stage_out, &err, &mut stage_state).await;
            // Dropping our end of the pipe tells the next stage its input ended.
            drop(stage_out);
            drop(stage_stdin);
            flow
        });
    }
    let flows = futures_util::future::join_all(runs).await;
    Flow::Normal(flows.last().map_or(0, |f| f.code()))
}

/// Expands one stage, sets up its redirections and runs it.
async fn run_stage(
    raw: &str,
    stdin: &mut Stdin,
    out: &Sink,
    err: &Sink,
    st: &mut ShellState,
) -> Flow {
    let expanded = substitute_commands(raw, st, err).await;
    let tokens = match tokenize(&expanded, st) {
        Ok(t) => t,
        Err(message) => {
            let _ = err
                .write_str(&format!("sh: syntax error: {message}\n"))
                .await;
            return Flow::Normal(2);
        }
    };
    let mut argv = Vec::new();
    let mut out = out.clone();
    let mut err_sink = err.clone();
    let mut fixed_stdin: Option<Stdin> = None;
    let mut tokens = tokens.into_iter();
    while let Some(token) = tokens.next() {
        match token {
            Token::Word(w) => argv.push(w),
            Token::Glob(pattern) => argv.extend(expand_glob(&pattern, st)),
            Token::Redirect(op) if op == "2>&1" => err_sink = out.clone(),
            Token::Redirect(op) if op == ">&2" => out = err_sink.clone(),
            Token::Redirect(op) if op == ">&1" => {}
            Token::Redirect(op) => {
                let Some(Token::Word(target) | Token::Glob(target)) = tokens.next() else {
                    let _ = err
                        .write_str("sh: syntax error: unexpected redirection\n")
                        .await;
                    return Flow::Normal(2);
                };
                match redirect(&op, &target, st) {
                    Ok(Redirection::Out(sink)) => out = sink,
                    Ok(Redirection::Err(sink)) => err_sink = sink,
                    Ok(Redirection::In(content)) => fixed_stdin = Some(Stdin::Fixed(Some(content))),
                    Err(message) => {
                        let _ = err.write_str(&format!("sh: {message}\n")).await;
                        return Flow::Normal(1);
                    }
                }
            }
        }
    }
    // Leading NAME=value words are assignments; alone they set shell variables.
    let assignments = argv.iter().take_while(|w| is_assignment(w)).count();
    for assignment in argv.drain(..assignments) {
        if let Some((name, value)) = assignment.split_once('=') {
            st.env.insert(name.to_string(), value.to_string());
        }
    }
    if argv.is_empty() {
        return Flow::Normal(0);
    }
    match fixed_stdin {
        Some(mut own) => run_program(argv, &mut own, &out, &err_sink, st).await,
        None => run_program(argv, stdin, &out, &err_sink, st).await,
    }
}

/// The index of the `)` closing the `(` at `open`, skipping quoted text.
fn matching_paren(chars: &[char], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let (mut single, mut double) = (false, false);
    let mut i = open;
    while i < chars.len() {
        match chars[i] {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '\\' if !single => i += 1,
            '(' if !single && !double => depth += 1,
            ')' if !single && !double => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Replaces every `$(...)` and `` `...` `` outside single quotes with the output of running it
/// (trailing newlines removed), escaped so that the tokenizer takes it as text: inside double
/// quotes it stays one word, outside it is split at whitespace, as in sh.
fn substitute_commands<'a>(
    raw: &'a str,
    st: &'a mut ShellState,
    err: &'a Sink,
) -> BoxFuture<'a, String> {
    Box::pin(async move {
        if !raw.contains("$(") && !raw.contains('`') {
            return raw.to_string();
        }
        let chars: Vec<char> = raw.chars().collect();
        let mut out = String::with_capacity(raw.len());
        let (mut single, mut double) = (false, false);
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if single {
                out.push(c);
                single = c != '\'';
                i += 1;
                continue;
            }
            let inner_end = match c {
                '$' if chars.get(i + 1) == Some(&'(') => {
                    matching_paren(&chars, i + 1).map(|end| (i + 2, end))
                }
                '`' => chars[i + 1..]
                    .iter()
                    .position(|&c| c == '`')
                    .map(|p| (i + 1, i + 1 + p)),
                _ => None,
            };
            match (c, inner_end) {
                (_, Some((start, end))) => {
                    let inner: String = chars[start..end].iter().collect();
                    let output = capture_output(&inner, st, err).await;
                    // `NAME=$(...)` is not split into words, as in sh.
                    let current_word = out.rsplit(char::is_whitespace).next().unwrap_or("");
                    let assignment = !double && is_assignment(current_word);
                    for ch in output.trim_end_matches('\n').chars() {
                        if assignment && ch == '\n' {
                            // A backslash-newline would be a line continuation.
                            out.push_str("'\n'");
                            continue;
                        }
                        let special = if double {
                            matches!(ch, '\\' | '"' | '$' | '`')
                        } else {
                            assignment
                                || (!ch.is_whitespace() && "\\'\";&|<>()#*?~$` ".contains(ch))
                        };
                        if special {
                            out.push('\\');
                        }
                        out.push(ch);
                    }
                    i = end + 1;
                    continue;
                }
                ('\\', None) => {
                    out.push(c);
                    if let Some(&next) = chars.get(i + 1) {
                        out.push(next);
                        i += 1;
                    }
                }
                ('\'', None) if !double => {
                    single = true;
                    out.push(c);
                }
                ('"', None) => {
                    double = !double;
                    out.push(c);
                }
                _ => out.push(c),
            }
            i += 1;
        }
        out
    })
}

/// Runs `script` in a subshell with no input and returns what it wrote on stdout.
async fn capture_output(script: &str, st: &mut ShellState, err: &Sink) -> String {
    let buffer = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = Sink::Buffer(buffer.clone());
    let mut subshell = st.clone();
    let mut no_input = Stdin::empty();
    let flow = run_script(script, &mut no_input, &sink, err, &mut subshell).await;
    st.last_status = flow.code();
    let bytes = buffer
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Expands a pattern whose last component has `*` or `?` against the pod filesystem; with no
/// match the pattern stays as written, as in sh.
fn expand_glob(pattern: &str, st: &ShellState) -> Vec<String> {
    let (dir_part, name_pattern) = match pattern.rfind('/') {
        Some(i) => (&pattern[..=i], &pattern[i + 1..]),
        None => ("", pattern),
    };
    if dir_part.contains(['*', '?']) {
        return vec![pattern.to_string()];
    }
    let dir = st.resolve(if dir_part.is_empty() { "." } else { dir_part });
    let names = fs::lock(&st.ctx.fs).list(&dir).unwrap_or_default();
    let matches: Vec<String> = names
        .into_iter()
        .filter(|name| !name.starts_with('.') || name_pattern.starts_with('.'))
        .filter(|name| wildcard_match(name_pattern.as_bytes(), name.as_bytes()))
        .map(|name| format!("{dir_part}{name}"))
        .collect();
    if matches.is_empty() {
        vec![pattern.to_string()]
    } else {
        matches
    }
}

fn wildcard_match(pattern: &[u8], text: &[u8]) -> bool {
    match (pattern.split_first(), text.split_first()) {
        (None, None) => true,
        (Some((b'*', rest)), _) => {
            wildcard_match(rest, text) || (!text.is_empty() && wildcard_match(pattern, &text[1..]))
        }
        (Some((b'?', rest)), Some((_, text_rest))) => wildcard_match(rest, text_rest),
        (Some((p, rest)), Some((t, text_rest))) if p == t => wildcard_match(rest, text_rest),
        _ => false,
    }
}

fn is_assignment(word: &str) -> bool {
    match word.split_once('=') {
        Some((name, _)) => {
            !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit())
        }
        None => false,
    }
}

enum Redirection {
    Out(Sink),
    Err(Sink),
    In(Bytes),
}

fn redirect(op: &str, target: &str, st: &ShellState) -> Result<Redirection, String> {
    let path = st.resolve(target);
    if op == "<" {
        if path == "/dev/null" {
            return Ok(Redirection::In(Bytes::new()));
        }
        return fs::lock(&st.ctx.fs)
            .read_file(&path)
            .map(|data| Redirection::In(Bytes::from(data)))
            .map_err(|e| format!("can't open {target}: {e}"));
    }
    let sink = if path == "/dev/null" {
        Sink::Discard
    } else {
        let append = op.ends_with(">>");
        let mut tree = fs::lock(&st.ctx.fs);
        // Truncate (or create) now, so that every later write appends.
        let existing = if append {
            tree.read_file(&path).unwrap_or_default()
        } else {
            Vec::new()
        };
        tree.write_file(&path, &existing, false)
            .map_err(|e| format!("can't create {target}: {e}"))?;
        Sink::File {
            fs: st.ctx.fs.clone(),
            path,
        }
    };
    Ok(if op.starts_with('2') {
        Redirection::Err(sink)
    } else {
        Redirection::Out(sink)
    })
}

/// Runs one program (or shell built-in) with its arguments.
fn run_program<'a>(
    argv: Vec<String>,
    stdin: &'a mut Stdin,
    out: &'a Sink,
    err: &'a Sink,
    st: &'a mut ShellState,
) -> BoxFuture<'a, Flow> {
    Box::pin(async move {
        let name = base_name(&argv[0]).to_string();
        let args = &argv[1..];
        let code = match name.as_str() {
            "exit" => {
                let code = args
                    .first()
                    .and_then(|a| a.parse::<i32>().ok())
                    .unwrap_or(st.last_status);
                return Flow::Exit(code & 0xff);
            }
            "sh" | "bash" | "ash" => return Flow::Normal(sh(args, stdin, out, err, st).await),
            "cd" => {
                let target = st.resolve(args.first().map_or("/root", String::as_str));
                let is_dir = fs::lock(&st.ctx.fs).is_dir(&target);
                if is_dir {
                    st.cwd = target;
                    0
                } else {
                    let _ = err
                        .write_str(&format!(
                            "sh: cd: can't cd to {}\n",
                            args.first().map_or("", String::as_str)
                        ))
                        .await;
                    2
                }
            }
            "export" => {
                for a in args {
                    if let Some((k, v)) = a.split_once('=') {
                        st.env.insert(k.to_string(), v.to_string());
                    }
                }
                0
            }
            "unset" => {
                for a in args {
                    st.env.remove(a);
                }
                0
            }
            ":" | "true" => 0,
            "false" => 1,
            "echo" => echo(args, out).await,
            "cat" => cat(args, stdin, out, err, st).await,
            "env" | "printenv" => printenv(&name, args, out, st).await,
            "hostname" => write_line(out, &st.ctx.pod).await,
            "pwd" => write_line(out, &st.cwd).await,
            "whoami" => write_line(out, "root").await,
            "id" => write_line(out, "uid=0(root) gid=0(root) groups=0(root)").await,
            "uname" => {
                let text = if args.iter().any(|a| a == "-a") {
                    format!(
                        "Linux {} 6.1.0-fleetgate-sim #1 SMP x86_64 GNU/Linux",
                        st.ctx.pod
                    )
                } else {
                    "Linux".to_string()
                };
                write_line(out, &text).await
            }
            "date" => date(args, out, err).await,
            "ls" => ls(args, out, err, st).await,
            "test" => test(args, st),
            "[" => {
                if args.last().map(String::as_str) == Some("]") {
                    test(&args[..args.len() - 1], st)
                } else {
                    let _ = err.write_str("sh: [: missing ]\n").await;
                    2
                }
            }
            "sleep" => sleep(args, err).await,
            "mkdir" => mkdir(args, err, st).await,
            "rm" => rm(args, err, st).await,
            "touch" => touch(args, err, st).await,
            "head" => head(args, stdin, out, err, st).await,
            "wc" => wc(args, stdin, out, err, st).await,
            "tail" => tail(args, stdin, out, err, st).await,
            "seq" => seq(args, out, err).await,
            "stty" => {
                let size = *st.ctx.terminal_size.borrow();
                match (args.first().map(String::as_str), size) {
                    (Some("size"), Some((cols, rows))) => {
                        write_line(out, &format!("{rows} {cols}")).await
                    }
                    (Some("size"), None) => {
                        let _ = err.write_str("stty: standard input: Not a tty\n").await;
                        1
                    }
                    _ => 0,
                }
            }
            "tar" => super::tar::run(args, stdin, out, err, st).await,
            _ => {
                let _ = err
                    .write_str(&format!("sh: {}: not found\n", argv[0]))
                    .await;
                127
            }
        };
        Flow::Normal(code)
    })
}

/// `sh -c SCRIPT`, `sh FILE`, or `sh` reading commands from stdin (interactive with a tty).
async fn sh(
    args: &[String],
    stdin: &mut Stdin,
    out: &Sink,
    err: &Sink,
    st: &mut ShellState,
) -> i32 {
    let mut rest = args.iter().skip_while(|a| a.starts_with('-') && *a != "-c");
    let mut subshell = st.clone();
    subshell.last_status = 0;
    match rest.next().map(String::as_str) {
        Some("-c") => {
            let Some(script) = rest.next() else {
                let _ = err.write_str("sh: -c requires an argument\n").await;
                return 2;
            };
            run_script(script, stdin, out, err, &mut subshell)
                .await
                .code()
        }
        Some(file) => {
            let path = subshell.resolve(file);
            let content = fs::lock(&subshell.ctx.fs).read_file(&path);
            let script = match content {
                Ok(data) => String::from_utf8_lossy(&data).into_owned(),
                Err(_) => {
                    let _ = err
                        .write_str(&format!(
                            "sh: can't open '{file}': No such file or directory\n"
                        ))
                        .await;
                    return 2;
                }
            };
            run_script(&script, stdin, out, err, &mut subshell)
                .await
                .code()
        }
        None => interactive(stdin, out, err, &mut subshell).await,
    }
}

/// Reads command lines from stdin and runs each as it completes. With a terminal it prints the
/// prompt `# ` and does what the terminal's line discipline would: echo, backspace, Ctrl-C,
/// Ctrl-D on an empty line.
async fn interactive(stdin: &mut Stdin, out: &Sink, err: &Sink, st: &mut ShellState) -> i32 {
    let tty = st.ctx.tty;
    if tty && out.write_str("# ").await.is_err() {
        return 0;
    }
    let mut line: Vec<u8> = Vec::new();
    while let Some(chunk) = stdin.read().await {
        for &byte in chunk.iter() {
            let run_line = match byte {
                b'\n' => true,
                b'\r' if tty => true,
                0x7f | 0x08 if tty => {
                    if line.pop().is_some() {
                        let _ = out.write(b"\x08 \x08").await;
                    }
                    false
                }
                0x03 if tty => {
                    line.clear();
                    let _ = out.write_str("^C\n# ").await;
                    false
                }
                0x04 if tty && line.is_empty() => {
                    let _ = out.write_str("exit\n").await;
                    return st.last_status;
                }
                other => {
                    line.push(other);
                    if tty {
                        let _ = out.write(&[other]).await;
                    }
                    false
                }
            };
            if run_line {
                if tty {
                    let _ = out.write_str("\n").await;
                }
                let text = String::from_utf8_lossy(&line).into_owned();
                line.clear();
                // Commands typed at the prompt get no stdin of their own in this shell.
                let mut no_input = Stdin::empty();
                if let Flow::Exit(code) = run_script(&text, &mut no_input, out, err, st).await {
                    return code;
                }
                if tty && out.write_str("# ").await.is_err() {
                    return st.last_status;
                }
            }
        }
    }
    if !line.is_empty() {
        let text = String::from_utf8_lossy(&line).into_owned();
        let mut no_input = Stdin::empty();
        return run_script(&text, &mut no_input, out, err, st).await.code();
    }
    st.last_status
}

async fn write_line(out: &Sink, text: &str) -> i32 {
    match out.write_str(&format!("{text}\n")).await {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

async fn echo(args: &[String], out: &Sink) -> i32 {
    let mut newline = true;
    let mut escapes = false;
    let mut words = args;
    while let Some(flag) = words.first() {
        match flag.as_str() {
            "-n" => newline = false,
            "-e" => escapes = true,
            "-ne" | "-en" => {
                newline = false;
                escapes = true;
            }
            _ => break,
        }
        words = &words[1..];
    }
    let mut text = words.join(" ");
    if escapes {
        text = text
            .replace("\\n", "\n")
            .replace("\\t", "\t")
            .replace("\\r", "\r")
            .replace("\\\\", "\\");
    }
    if newline {
        text.push('\n');
    }
    match out.write_str(&text).await {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

async fn cat(args: &[String], stdin: &mut Stdin, out: &Sink, err: &Sink, st: &ShellState) -> i32 {
    let files: Vec<&String> = args
        .iter()
        .filter(|a| !a.starts_with('-') || *a == "-")
        .collect();
    if files.is_empty() {
        while let Some(chunk) = stdin.read().await {
            if out.write(&chunk).await.is_err() {
                return 1;
            }
        }
        return 0;
    }
    let mut code = 0;
    for file in files {
        if file == "-" {
            while let Some(chunk) = stdin.read().await {
                if out.write(&chunk).await.is_err() {
                    return 1;
                }
            }
            continue;
        }
        let path = st.resolve(file);
        if let Some(device) = Device::at(&path) {
            if device.copy_to(out, None).await.is_err() {
                return 1;
            }
            continue;
        }
        let content = fs::lock(&st.ctx.fs).read_file(&path);
        match content {
            Ok(data) => {
                if out.write(&data).await.is_err() {
                    return 1;
                }
            }
            Err(e) => {
                let _ = err.write_str(&format!("cat: {file}: {e}\n")).await;
                code = 1;
            }
        }
    }
    code
}

/// The character devices of the pod: endless sources for throughput tests
/// (`head -c 100000000 /dev/zero`), and the empty `/dev/null`.
#[derive(Debug, Clone, Copy)]
enum Device {
    Null,
    Zero,
    Random,
}

impl Device {
    fn at(path: &str) -> Option<Device> {
        match path {
            "/dev/null" => Some(Device::Null),
            "/dev/zero" => Some(Device::Zero),
            "/dev/urandom" | "/dev/random" => Some(Device::Random),
            _ => None,
        }
    }

    /// Writes `limit` bytes of the device (all of it when `None`) to `out`.
    async fn copy_to(
        self,
        out: &Sink,
        limit: Option<usize>,
    ) -> Result<(), super::process::BrokenPipe> {
        const CHUNK: usize = 32 * 1024;
        if let Device::Null = self {
            return Ok(());
        }
        let zeros = Bytes::from(vec![0u8; CHUNK]);
        let mut left = limit.unwrap_or(usize::MAX);
        while left > 0 {
            let n = left.min(CHUNK);
            match self {
                Device::Random => {
                    let mut chunk = vec![0u8; n];
                    rand::Rng::fill(&mut rand::rng(), chunk.as_mut_slice());
                    out.write(&chunk).await?;
                }
                _ => out.write(&zeros[..n]).await?,
            }
            left -= n;
        }
        Ok(())
    }
}

async fn printenv(name: &str, args: &[String], out: &Sink, st: &ShellState) -> i32 {
    if name == "printenv" && !args.is_empty() {
        let mut code = 0;
        for var in args {
            match st.env.get(var) {
                Some(value) => {
                    let _ = out.write_str(&format!("{value}\n")).await;
                }
                None => code = 1,
            }
        }
        return code;
    }
    let text: String = st.env.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    match out.write_str(&text).await {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

async fn date(args: &[String], out: &Sink, err: &Sink) -> i32 {
    use std::fmt::Write as _;
    let now = chrono::Utc::now();
    let format = args
        .iter()
        .find_map(|a| a.strip_prefix('+'))
        .unwrap_or("%a %b %e %H:%M:%S UTC %Y");
    // chrono reports an unknown specifier as a formatting error (`to_string` would panic).
    let mut text = String::new();
    if write!(text, "{}", now.format(format)).is_err() {
        let _ = err
            .write_str(&format!("date: invalid date format '{format}'\n"))
            .await;
        return 1;
    }
    write_line(out, &text).await
}

async fn ls(args: &[String], out: &Sink, err: &Sink, st: &ShellState) -> i32 {
    let flags: String = args
        .iter()
        .filter(|a| a.starts_with('-') && a.len() > 1)
        .flat_map(|a| a.chars().skip(1))
        .collect();
    let long = flags.contains('l');
    let all = flags.contains('a');
    let directory_itself = flags.contains('d');
    let mut targets: Vec<&str> = args
        .iter()
        .filter(|a| !a.starts_with('-') || a.len() == 1)
        .map(String::as_str)
        .collect();
    if targets.is_empty() {
        targets.push(".");
    }
    // (to stderr?, text) pieces, written in order once the filesystem lock is released.
    let mut pieces: Vec<(bool, String)> = Vec::new();
    let mut code = 0;
    let several = targets.len() > 1;
    {
        let tree = fs::lock(&st.ctx.fs);
        for (index, target) in targets.iter().enumerate() {
            let path = st.resolve(target);
            match tree.get(&path) {
                None => {
                    code = 2;
                    pieces.push((
                        true,
                        format!("ls: cannot access '{target}': No such file or directory\n"),
                    ));
                }
                Some(Node::File { .. }) => {
                    pieces.push((false, ls_entry(&tree, &path, target, long)))
                }
                Some(Node::Dir { .. }) if directory_itself => {
                    pieces.push((false, ls_entry(&tree, &path, target, long)))
                }
                Some(Node::Dir { .. }) => {
                    let mut text = String::new();
                    if several {
                        if index > 0 {
                            text.push('\n');
                        }
                        text.push_str(&format!("{target}:\n"));
                    }
                    let mut names = tree.list(&path).unwrap_or_default();
                    if all {
                        names.insert(0, "..".to_string());
                        names.insert(0, ".".to_string());
                    }
                    for name in names {
                        let child = fs::normalize(&path, &name);
                        text.push_str(&ls_entry(&tree, &child, &name, long));
                    }
                    pieces.push((false, text));
                }
            }
        }
    }
    for (to_stderr, text) in pieces {
        let sink = if to_stderr { err } else { out };
        if sink.write_str(&text).await.is_err() {
            return 1;
        }
    }
    code
}

fn ls_entry(tree: &fs::FsTree, path: &str, shown: &str, long: bool) -> String {
    if !long {
        return format!("{shown}\n");
    }
    let (kind, mode, size, modified) = match tree.get(path) {
        Some(Node::Dir { modified }) => ('d', 0o755, 4096, *modified),
        Some(Node::File {
            data,
            mode,
            modified,
        }) => ('-', *mode, data.len(), *modified),
        None => ('?', 0, 0, std::time::SystemTime::now()),
    };
    let mut perms = String::new();
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        perms.push(if bits & 4 != 0 { 'r' } else { '-' });
        perms.push(if bits & 2 != 0 { 'w' } else { '-' });
        perms.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    let when: chrono::DateTime<chrono::Utc> = modified.into();
    format!(
        "{kind}{perms}    1 root     root     {size:>8} {} {shown}\n",
        when.format("%b %e %H:%M")
    )
}

fn test(args: &[String], st: &ShellState) -> i32 {
    fn eval(args: &[String], st: &ShellState) -> bool {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        match a.as_slice() {
            [] => false,
            ["!", rest @ ..] => !eval(&rest.iter().map(|s| s.to_string()).collect::<Vec<_>>(), st),
            [one] => !one.is_empty(),
            [op, operand] => {
                let path = st.resolve(operand);
                let tree = fs::lock(&st.ctx.fs);
                match *op {
                    "-d" => tree.is_dir(&path),
                    "-f" => matches!(tree.get(&path), Some(Node::File { .. })),
                    "-e" => tree.get(&path).is_some(),
                    "-s" => {
                        matches!(tree.get(&path), Some(Node::File { data, .. }) if !data.is_empty())
                    }
                    "-r" | "-w" => tree.get(&path).is_some(),
                    "-x" => matches!(tree.get(&path), Some(Node::Dir { .. })),
                    "-z" => operand.is_empty(),
                    "-n" => !operand.is_empty(),
                    _ => false,
                }
            }
            [left, op, right] => {
                let numbers = left.parse::<i64>().ok().zip(right.parse::<i64>().ok());
                match (*op, numbers) {
                    ("=" | "==", _) => left == right,
                    ("!=", _) => left != right,
                    ("-eq", Some((l, r))) => l == r,
                    ("-ne", Some((l, r))) => l != r,
                    ("-lt", Some((l, r))) => l < r,
                    ("-le", Some((l, r))) => l <= r,
                    ("-gt", Some((l, r))) => l > r,
                    ("-ge", Some((l, r))) => l >= r,
                    _ => false,
                }
            }
            _ => false,
        }
    }
    if eval(args, st) {
        0
    } else {
        1
    }
}

async fn sleep(args: &[String], err: &Sink) -> i32 {
    let Some(arg) = args.first() else {
        let _ = err.write_str("sleep: missing operand\n").await;
        return 1;
    };
    if arg == "infinity" {
        std::future::pending::<()>().await;
    }
    let seconds: f64 = match arg.trim_end_matches('s').parse() {
        Ok(s) if s >= 0.0 => s,
        _ => {
            let _ = err
                .write_str(&format!("sleep: invalid time interval '{arg}'\n"))
                .await;
            return 1;
        }
    };
    tokio::time::sleep(std::time::Duration::from_secs_f64(seconds.min(1e9))).await;
    0
}

/// Runs `op` on each operand (each argument that is no flag), as mkdir, rm and touch do: the
/// message of a failure goes to stderr, the next operand is tried all the same, and the exit
/// code is 1 if any failed.
async fn each_operand(
    args: &[String],
    err: &Sink,
    mut op: impl FnMut(&str) -> Result<(), String>,
) -> i32 {
    let mut code = 0;
    for operand in args.iter().filter(|a| !a.starts_with('-')) {
        if let Err(message) = op(operand) {
            let _ = err.write_str(&format!("{message}\n")).await;
            code = 1;
        }
    }
    code
}

async fn mkdir(args: &[String], err: &Sink, st: &ShellState) -> i32 {
    let parents = args.iter().any(|a| a == "-p");
    each_operand(args, err, |dir| {
        fs::lock(&st.ctx.fs)
            .mkdir(&st.resolve(dir), parents)
            .map_err(|e| format!("mkdir: can't create directory '{dir}': {e}"))
    })
    .await
}

async fn rm(args: &[String], err: &Sink, st: &ShellState) -> i32 {
    let flags: String = args
        .iter()
        .filter(|a| a.starts_with('-'))
        .flat_map(|a| a.chars().skip(1))
        .collect();
    let recursive = flags.contains('r') || flags.contains('R');
    let force = flags.contains('f');
    each_operand(args, err, |target| {
        match fs::lock(&st.ctx.fs).remove(&st.resolve(target), recursive) {
            Ok(()) => Ok(()),
            Err(FsError::NotFound) if force => Ok(()),
            Err(FsError::NotEmpty) => Err(format!("rm: '{target}' is a directory")),
            Err(e) => Err(format!("rm: can't remove '{target}': {e}")),
        }
    })
    .await
}

async fn touch(args: &[String], err: &Sink, st: &ShellState) -> i32 {
    each_operand(args, err, |file| {
        fs::lock(&st.ctx.fs)
            .write_file(&st.resolve(file), b"", true)
            .map_err(|e| format!("touch: {file}: {e}"))
    })
    .await
}

/// Reads the named file, or stdin when there is none.
async fn input_of(
    file: Option<&String>,
    stdin: &mut Stdin,
    st: &ShellState,
) -> Result<Vec<u8>, FsError> {
    match file {
        Some(f) if f != "-" => fs::lock(&st.ctx.fs).read_file(&st.resolve(f)),
        _ => Ok(stdin.read_to_end().await),
    }
}

async fn head(args: &[String], stdin: &mut Stdin, out: &Sink, err: &Sink, st: &ShellState) -> i32 {
    let mut bytes: Option<usize> = None;
    let mut lines = 10usize;
    let mut file = None;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "-c" => {
                bytes = args.get(i + 1).and_then(|n| n.parse().ok());
                i += 1;
            }
            "-n" => {
                lines = args.get(i + 1).and_then(|n| n.parse().ok()).unwrap_or(10);
                i += 1;
            }
            other => file = Some(&args[i]).filter(|_| !other.is_empty()),
        }
        i += 1;
    }
    if let Some(device) = file.and_then(|f| Device::at(&st.resolve(f))) {
        // Endless sources: only a byte count makes sense (`head -c N /dev/zero`).
        let limit = bytes.unwrap_or(lines * 4096);
        return match device.copy_to(out, Some(limit)).await {
            Ok(()) => 0,
            Err(_) => 1,
        };
    }
    if let Some(limit) = bytes {
        // Stream, so `head -c N` ends after N bytes even on an endless input.
        if file.is_none() {
            let mut left = limit;
            while left > 0 {
                let Some(chunk) = stdin.read().await else {
                    break;
                };
                let take = chunk.len().min(left);
                if out.write(&chunk[..take]).await.is_err() {
                    return 1;
                }
                left -= take;
            }
            return 0;
        }
    }
    let data = match input_of(file, stdin, st).await {
        Ok(d) => d,
        Err(e) => {
            let _ = err
                .write_str(&format!(
                    "head: {}: {e}\n",
                    file.map_or("-", |f| f.as_str())
                ))
                .await;
            return 1;
        }
    };
    let end = match bytes {
        Some(limit) => limit.min(data.len()),
        None => data
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .nth(lines.saturating_sub(1))
            .map_or(data.len(), |(i, _)| i + 1),
    };
    if lines == 0 && bytes.is_none() {
        return 0;
    }
    match out.write(&data[..end]).await {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// `tail -c +N` (from byte N on: what `kubectl cp --retries` runs), `tail -c N`, `tail -n N`.
async fn tail(args: &[String], stdin: &mut Stdin, out: &Sink, err: &Sink, st: &ShellState) -> i32 {
    let mut spec: Option<(char, String)> = None;
    let mut file = None;
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        if let Some(rest) = arg.strip_prefix("-c").or_else(|| arg.strip_prefix("-n")) {
            let unit = if arg.starts_with("-c") { 'c' } else { 'n' };
            let value = if rest.is_empty() {
                i += 1;
                args.get(i).cloned().unwrap_or_default()
            } else {
                rest.to_string()
            };
            spec = Some((unit, value));
        } else if arg != "-" {
            file = Some(arg);
        }
        i += 1;
    }
    let (unit, value) = spec.unwrap_or(('n', "10".to_string()));
    let from_start = value.starts_with('+');
    let Ok(count) = value.trim_start_matches('+').parse::<usize>() else {
        let _ = err
            .write_str(&format!("tail: invalid number '{value}'\n"))
            .await;
        return 1;
    };
    if unit == 'c' && from_start && file.is_none() {
        // Streamed: skip the first N-1 bytes, copy the rest as it comes.
        let mut skip = count.saturating_sub(1);
        while let Some(chunk) = stdin.read().await {
            let start = skip.min(chunk.len());
            skip -= start;
            if out.write(&chunk[start..]).await.is_err() {
                return 1;
            }
        }
        return 0;
    }
    let data = match file {
        Some(f) => match read_pod_file(st, f) {
            Ok(d) => d,
            Err(e) => {
                let _ = err.write_str(&format!("tail: {f}: {e}\n")).await;
                return 1;
            }
        },
        None => stdin.read_to_end().await,
    };
    let start = match (unit, from_start) {
        ('c', true) => count.saturating_sub(1).min(data.len()),
        ('c', false) => data.len().saturating_sub(count),
        (_, true) => data
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .nth(count.saturating_sub(2))
            .map_or(if count <= 1 { 0 } else { data.len() }, |(i, _)| i + 1),
        (_, false) => {
            let body = data.strip_suffix(b"\n").unwrap_or(&data);
            let mut newlines = body.iter().enumerate().rev().filter(|(_, b)| **b == b'\n');
            match count {
                0 => data.len(),
                n => newlines.nth(n - 1).map_or(0, |(i, _)| i + 1),
            }
        }
    };
    match out.write(&data[start..]).await {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// Reads a pod file; the lock is released before the caller awaits anything.
fn read_pod_file(st: &ShellState, file: &str) -> Result<Vec<u8>, FsError> {
    fs::lock(&st.ctx.fs).read_file(&st.resolve(file))
}

async fn wc(args: &[String], stdin: &mut Stdin, out: &Sink, err: &Sink, st: &ShellState) -> i32 {
    let bytes_only = args.iter().any(|a| a == "-c");
    let lines_only = args.iter().any(|a| a == "-l");
    let (mut bytes, mut lines, mut words) = (0usize, 0usize, 0usize);
    let mut in_word = false;
    let mut count = |chunk: &[u8]| {
        bytes += chunk.len();
        // Counting only bytes stays cheap on large inputs (`wc -c` in throughput checks).
        if bytes_only {
            return;
        }
        for &b in chunk {
            if b == b'\n' {
                lines += 1;
            }
            let space = b.is_ascii_whitespace();
            if !space && !in_word {
                words += 1;
            }
            in_word = !space;
        }
    };
    match args.iter().find(|a| !a.starts_with('-')) {
        Some(file) if file != "-" => match read_pod_file(st, file) {
            Ok(data) => count(&data),
            Err(e) => {
                let _ = err.write_str(&format!("wc: {file}: {e}\n")).await;
                return 1;
            }
        },
        _ => {
            while let Some(chunk) = stdin.read().await {
                count(&chunk);
            }
        }
    }
    let text = if bytes_only {
        bytes.to_string()
    } else if lines_only {
        lines.to_string()
    } else {
        format!("{lines:>7} {words:>7} {bytes:>7}")
    };
    write_line(out, &text).await
}

async fn seq(args: &[String], out: &Sink, err: &Sink) -> i32 {
    let numbers: Vec<i64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let (first, last) = match numbers.as_slice() {
        [last] => (1, *last),
        [first, last, ..] => (*first, *last),
        _ => {
            let _ = err.write_str("seq: missing operand\n").await;
            return 1;
        }
    };
    let mut text = String::new();
    for n in first..=last {
        text.push_str(&n.to_string());
        text.push('\n');
        if text.len() >= 32 * 1024 {
            if out.write_str(&text).await.is_err() {
                return 1;
            }
            text.clear();
        }
    }
    match out.write_str(&text).await {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::sim::stream::fs::pod_filesystem;

    pub(crate) fn context(pod: &str, tty: bool) -> PodContext {
        let (_tx, rx) = tokio::sync::watch::channel(None);
        PodContext {
            pod: pod.into(),
            fs: pod_filesystem("test", pod),
            tty,
            terminal_size: rx,
        }
    }

    /// Runs `sh -c script` with nothing on stdin; returns (exit, stdout, stderr).
    pub(crate) async fn sh(script: &str, ctx: PodContext) -> (ProcessExit, String, String) {
        run(&["sh", "-c", script], b"", ctx).await
    }

    /// Runs a command with the given stdin; returns (exit, stdout, stderr).
    pub(crate) async fn run(
        argv: &[&str],
        input: &[u8],
        ctx: PodContext,
    ) -> (ProcessExit, String, String) {
        let (out_tx, mut out_rx) = mpsc::channel(4);
        let (err_tx, mut err_rx) = mpsc::channel(4);
        let io = ProcessIo {
            stdin: Stdin::Fixed(Some(Bytes::copy_from_slice(input))),
            stdout: Sink::Channel {
                tx: out_tx,
                crlf: ctx.tty,
            },
            stderr: Sink::Channel {
                tx: err_tx,
                crlf: ctx.tty,
            },
        };
        let argv = argv.iter().map(|s| s.to_string()).collect();
        let collect_out = tokio::spawn(async move {
            let mut all = Vec::new();
            while let Some(c) = out_rx.recv().await {
                all.extend_from_slice(&c);
            }
            String::from_utf8(all).unwrap()
        });
        let collect_err = tokio::spawn(async move {
            let mut all = Vec::new();
            while let Some(c) = err_rx.recv().await {
                all.extend_from_slice(&c);
            }
            String::from_utf8(all).unwrap()
        });
        let exit = run_exec(argv, io, ctx).await;
        (exit, collect_out.await.unwrap(), collect_err.await.unwrap())
    }

    #[tokio::test]
    async fn echo_and_exit_codes() {
        let (exit, out, _) = run(&["echo", "hi", "there"], b"", context("p1", false)).await;
        assert_eq!((exit, out.as_str()), (ProcessExit::Code(0), "hi there\n"));
        let (exit, _, _) = sh("exit 3", context("p1", false)).await;
        assert_eq!(exit, ProcessExit::Code(3));
        let (exit, out, _) = sh(
            "echo 'a b'; echo \"$HOSTNAME\"; exit 7",
            context("p1", false),
        )
        .await;
        assert_eq!((exit, out.as_str()), (ProcessExit::Code(7), "a b\np1\n"));
        let (exit, _, _) = run(&["false"], b"", context("p1", false)).await;
        assert_eq!(exit, ProcessExit::Code(1));
    }

    #[tokio::test]
    async fn unknown_program_fails_to_start() {
        let (exit, _, _) = run(&["foo"], b"", context("p1", false)).await;
        match exit {
            ProcessExit::StartFailed(m) => {
                assert!(m.contains(r#"exec: "foo": executable file not found in $PATH"#))
            }
            other => panic!("unexpected {other:?}"),
        }
        let (exit, _, err) = sh("foo", context("p1", false)).await;
        assert_eq!(exit, ProcessExit::Code(127));
        assert!(err.contains("foo: not found"));
    }

    #[tokio::test]
    async fn cat_pipes_redirections_and_conditionals() {
        let (_, out, _) = run(&["cat"], b"abc\n", context("p2", false)).await;
        assert_eq!(out, "abc\n");
        let (exit, out, _) = sh("echo hello > /tmp/f && cat /tmp/f | cat; test -f /tmp/f || echo missing; false || echo recovered; echo $?", context("p2", false))
        .await;
        assert_eq!(exit, ProcessExit::Code(0));
        assert_eq!(out, "hello\nrecovered\n0\n");
        let (_, out, _) = sh("ls /nope 2>&1; echo x 2>/dev/null", context("p2", false)).await;
        assert!(out.contains("No such file or directory"), "{out}");
    }

    #[tokio::test]
    async fn endless_devices_stream_through_pipelines() {
        let (exit, out, _) = sh(
            "head -c 100000 /dev/zero | wc -c; cat /dev/urandom | head -c 5 | wc -c; cat /dev/null",
            context("p4", false),
        )
        .await;
        assert_eq!((exit, out.as_str()), (ProcessExit::Code(0), "100000\n5\n"));
    }

    #[tokio::test]
    async fn command_substitution_and_globs() {
        let ctx = context("p6", false);
        let script = "mkdir -p /g && touch /g/a.txt /g/b.txt /g/c.log; echo /g/*.txt; \
                      cd /g; echo *.log x?txt; echo \"host=$(hostname)\" `echo a; echo b`; \
                      n=$(echo 'one two;three'); echo \"[$n]\"; echo '*'";
        let (exit, out, err) = sh(script, ctx).await;
        assert_eq!(exit, ProcessExit::Code(0), "{err}");
        assert_eq!(
            out,
            "/g/a.txt /g/b.txt\nc.log x?txt\nhost=p6 a b\n[one two;three]\n*\n"
        );
    }

    #[tokio::test]
    async fn date_formats_and_rejects_bad_ones() {
        let (exit, out, _) = run(&["date", "+%Y"], b"", context("p7", false)).await;
        assert_eq!(exit, ProcessExit::Code(0));
        assert_eq!(out.trim().len(), 4);
        let (exit, _, err) = run(&["date", "+%Q%"], b"", context("p7", false)).await;
        assert_eq!(exit, ProcessExit::Code(1));
        assert!(err.contains("invalid date format"));
    }

    #[tokio::test]
    async fn random_scripts_never_panic_or_hang() {
        use rand::{Rng, SeedableRng};
        const PIECES: &[&str] = &[
            "echo", "cat", "true", "false", "ls", "test", "[", "]", "tail", "head", "-c", "'",
            "\"", "$", "(", ")", "`", ";", "&", "&&", "|", "||", ">", ">>", "<", "2>&1", "*", "?",
            "\\", " ", "\n", "x", "=", "{", "}", "#", "~", "/tmp", "é", "$?", "${", "sh", "-c",
            "1",
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for _ in 0..400 {
            let script: String = (0..rng.random_range(1..14))
                .map(|_| PIECES[rng.random_range(0..PIECES.len())])
                .collect();
            let ran = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                run(&["sh", "-c", &script], b"in", context("fuzz", false)),
            )
            .await;
            assert!(ran.is_ok(), "script hung: {script:?}");
        }
    }

    #[tokio::test]
    async fn tail_variants() {
        let ctx = context("p5", false);
        let (_, out, _) = sh(
            "seq 5 | tail -n 2; echo abcdef | tail -c+3; seq 3 | tail -c 2; seq 4 | tail -n +3",
            ctx,
        )
        .await;
        assert_eq!(out, "4\n5\ncdef\n3\n3\n4\n");
    }

    #[tokio::test]
    async fn shell_reads_commands_from_stdin_and_tty_shell_prompts() {
        let (exit, out, _) = run(
            &["sh"],
            b"echo one\necho two\nexit 4\necho never\n",
            context("p3", false),
        )
        .await;
        assert_eq!((exit, out.as_str()), (ProcessExit::Code(4), "one\ntwo\n"));
        let (exit, out, _) = run(&["sh"], b"echo hi\rexit\r", context("p3", true)).await;
        assert_eq!(exit, ProcessExit::Code(0));
        assert_eq!(out, "# echo hi\r\nhi\r\n# exit\r\n");
    }
}
