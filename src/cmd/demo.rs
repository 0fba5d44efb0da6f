//! `warden demo`: the built-in scripted team's acts ([`warden::cli::demo`]).

use std::{io::IsTerminal, process::ExitCode};

/// Runs the demo; its question (an approval) is asked on the terminal, answered "no answer" when
/// standard input is not one.
pub(crate) fn demo() -> ExitCode {
    let terminal = std::io::stdin().is_terminal();
    let mut asker = move |_question: &str| -> Option<String> {
        if !terminal {
            return None;
        }
        print!("   your answer (yes/no): ");
        let _ = std::io::Write::flush(&mut std::io::stdout());
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).ok()?;
        Some(line.trim().to_owned())
    };
    let result = actix_rt::System::new().block_on(async {
        let mut stdout = std::io::stdout();
        warden::cli::demo::run(&mut stdout, &mut asker).await
    });
    super::finish(result.map(|_| ()))
}
