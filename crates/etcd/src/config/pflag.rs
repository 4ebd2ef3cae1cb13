//! pflag's scan of a cobra subcommand's command line (`etcd gateway start`, `etcd grpc-proxy
//! start`): etcd's member flags use Go's `flag` package (`goparse`), its subcommands use
//! cobra/pflag, whose syntax and error texts differ.
//!
//! Owns the syntax only: `--name=value`, `--name value` (a boolean flag alone means `true`),
//! `-h`/`--help` (noted, and scanning goes on, so a later error still wins as in pflag), `--`
//! ends the flags, and positional arguments are ignored (the `start` commands take none). What a
//! flag means is the caller's.

/// Scans `args`. `is_bool(name)` is `None` for an unknown flag, else whether the flag is
/// boolean; `set(name, value)` applies one flag and returns the error text to print.
/// Returns whether help was asked for.
pub(crate) fn scan(
    args: &[String],
    is_bool: impl Fn(&str) -> Option<bool>,
    mut set: impl FnMut(&str, &str) -> Result<(), String>,
) -> Result<bool, String> {
    let mut help = false;
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            break;
        }
        if let Some(body) = arg.strip_prefix("--") {
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (body, None),
            };
            if name == "help" {
                help = true;
                continue;
            }
            let boolean = is_bool(name).ok_or_else(|| format!("unknown flag: --{name}"))?;
            let value = match (inline, boolean) {
                (Some(v), _) => v.to_owned(),
                (None, true) => "true".to_owned(),
                (None, false) => {
                    let next = args
                        .get(i)
                        .ok_or_else(|| format!("flag needs an argument: --{name}"))?;
                    i += 1;
                    next.clone()
                }
            };
            set(name, &value)?;
        } else if let Some(shorts) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
            // The only shorthand is -h. pflag names what is left of the group from the bad one.
            for (at, c) in shorts.char_indices() {
                if c != 'h' {
                    let rest = &shorts[at..];
                    return Err(format!("unknown shorthand flag: '{c}' in -{rest}"));
                }
                help = true;
            }
        }
    }
    Ok(help)
}

/// cobra's search for a subcommand (`stripFlags`): the first argument that is neither a flag
/// nor a flag's value. Returns it with the other arguments in their order, so the subcommand's
/// flags may come before its name (`etcd gateway --endpoints=a start`), as cobra lets them.
/// `is_bool(name)` tells a flag that takes no value (by long name, or one-letter shorthand);
/// any other flag written without `=` takes the next argument. `--` ends the search.
pub(crate) fn split_subcommand(
    args: &[String],
    is_bool: impl Fn(&str) -> bool,
) -> Option<(String, Vec<String>)> {
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        if arg == "--" {
            return None;
        }
        let flag = arg
            .strip_prefix("--")
            .or_else(|| arg.strip_prefix('-').filter(|s| s.chars().count() == 1));
        match flag {
            Some(name)
                if !name.contains('=') && name != "help" && name != "h" && !is_bool(name) =>
            {
                i += 2
            }
            Some(_) => i += 1,
            None if arg.starts_with('-') => i += 1,
            None => {
                let rest = args[..i].iter().chain(&args[i + 1..]).cloned().collect();
                return Some((arg.to_owned(), rest));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subcommand_anywhere_on_the_line() {
        let args = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let split = |l: &[&str]| split_subcommand(&args(l), |n| n == "flag" || n == "f");
        assert_eq!(
            split(&["start", "--name", "a"]),
            Some(("start".into(), args(&["--name", "a"])))
        );
        assert_eq!(
            split(&["--name=a", "start", "--flag"]),
            Some(("start".into(), args(&["--name=a", "--flag"])))
        );
        // A flag with a value takes the next argument; a boolean one does not.
        assert_eq!(
            split(&["--name", "a", "--flag", "-f", "-h", "start", "x"]),
            Some((
                "start".into(),
                args(&["--name", "a", "--flag", "-f", "-h", "x"])
            ))
        );
        assert_eq!(
            split(&["-w", "json", "status", "f.db"]),
            Some(("status".into(), args(&["-w", "json", "f.db"])))
        );
        assert_eq!(split(&["--name", "start"]), None);
        assert_eq!(split(&["--", "start"]), None);
        assert_eq!(split(&[]), None);
    }

    fn run(list: &[&str]) -> Result<(bool, Vec<(String, String)>), String> {
        let args: Vec<String> = list.iter().map(|s| s.to_string()).collect();
        let mut seen = Vec::new();
        let help = scan(
            &args,
            |name| match name {
                "flag" => Some(true),
                "name" => Some(false),
                _ => None,
            },
            |name, value| {
                seen.push((name.to_owned(), value.to_owned()));
                Ok(())
            },
        )?;
        Ok((help, seen))
    }

    #[test]
    fn pflag_syntax() {
        let pair = |n: &str, v: &str| (n.to_owned(), v.to_owned());
        assert_eq!(
            run(&["--name", "a", "--name=b", "--flag", "pos", "--", "--bogus"]),
            Ok((
                false,
                vec![pair("name", "a"), pair("name", "b"), pair("flag", "true")]
            ))
        );
        assert_eq!(run(&["-h"]), Ok((true, vec![])));
        // As pflag: help does not stop the scan, a later error wins.
        assert_eq!(
            run(&["--help", "--bogus"]),
            Err("unknown flag: --bogus".into())
        );
        assert_eq!(
            run(&["-hx"]),
            Err("unknown shorthand flag: 'x' in -x".into())
        );
        assert_eq!(
            run(&["--name"]),
            Err("flag needs an argument: --name".into())
        );
    }
}
